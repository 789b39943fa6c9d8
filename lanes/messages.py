"""A task's message: stored compact in its record, written out as a Celery (protocol 2) message in
kombu's Redis envelope when a worker pops it.

Dispatch publishes from inside its admission script, so admission and publish
are one atomic Redis call: there is no window in which a task is accepted but
not in the broker. The lane list holds only the record's key and its publish
count (``<record>#<publish>``); the record holds what cannot be rebuilt
(:func:`build_message`), and :func:`kombu_message` writes, from it and the
delivery tag the pop makes (``<task id>.<publish>``), what kombu's
``Channel._put`` would have written (BENCHMARKS.md: a waiting task's bytes).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings

from lanes import jsontext, keys
from lanes.priorities import to_kombu

#: Header of a message whose task Redis already tracks with a lease (its record, written by the
#: platform's scripts): ``lanes.transport`` holds it in memory, with no copy in Redis.
LEASED_HEADER = "dispatch_leased"
#: Header naming the task record of a leased message (``lanes.keys.task_record``).
RECORD_HEADER = "dispatch_record"
#: Between a record's key and its publish number in a lane list's item (``<record>#<publish>``, as
#: ``_lib.lua``'s ``list_item`` writes it).
LIST_ITEM_SEPARATOR = "#"
#: The body's third part (Celery's callbacks, errbacks, chain, chord): none, so empty. Celery reads each
#: with ``embed.get`` (and the headers and properties a message leaves out, at their defaults, with
#: ``.get``).
_EMBED: dict[str, Any] = {}
#: Seconds between the soft time limit (handler told to stop) and the hard one (process killed),
#: beyond the time an attempt may spend recording its outcome while Redis is away (see
#: :func:`hard_limit_grace_s`).
HARD_LIMIT_GRACE_S = 5.0


def hard_limit_grace_s() -> float:
    """Room after the soft limit: the grace, plus the outcome call's retries (two leases,
    ``tasks.execution.until_answered``) and a Redis timeout on each side of them.

    A hard limit inside that window killed a prefork child that waited for a frozen
    Redis to record its outcome; killed while writing its result to the pool's pipe,
    the child left half a message, and the worker's main process stopped on
    ``UnpicklingError`` (fault scenario 4, intermittent).
    """
    return HARD_LIMIT_GRACE_S + 2 * settings.DISPATCH_LEASE_S + 2 * settings.DISPATCH_REDIS_TIMEOUT_S


@dataclass(slots=True)
class Envelope:
    """What the platform carries beside the payload, in the task's ``dispatch`` kwarg.

    A value: never changed once made (``dataclasses.replace`` makes the next attempt's). Not frozen
    only for speed: a frozen dataclass's ``__init__`` costs four times as much, once per dispatch.
    """

    type: str
    lane: str
    priority: int
    attempt: int
    deadline: float  # epoch seconds
    dispatched_at: float  # epoch seconds
    chat: str = ""
    key: str = ""  # idempotency key
    meta: dict | None = None
    #: The retry policy the caller named for this task ('' : its type's), carried across its retries.
    policy: str = ""
    #: When a task sent for later was due, epoch seconds (0: dispatched for now); queue latency counts from it.
    due: float = 0.0
    #: The dispatch's trace context (``tasks.tracing``: W3C ``traceparent``/``tracestate``, and a retry's link);
    #: None when the caller did not trace. Carried to the next attempt with the rest.
    trace: dict[str, str] | None = None

    @property
    def ready_at(self) -> float:
        """When the task could first start: its due time if it was sent for later, else its dispatch."""
        return max(self.dispatched_at, self.due)

    def as_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies, and this runs on every dispatch
        # only to be serialised at once.
        out = {"type": self.type, "lane": self.lane, "priority": self.priority, "attempt": self.attempt,
               "deadline": self.deadline, "dispatched_at": self.dispatched_at, "chat": self.chat,
               "key": self.key, "meta": self.meta}
        if self.policy:  # only when named: a plain dispatch's message is unchanged
            out["policy"] = self.policy
        if self.due:
            out["due"] = self.due
        if self.trace:
            out["trace"] = self.trace
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Envelope:
        """Parse a received envelope; raise ValueError naming the bad field (every delivery parses one: the
        checks are a table read once, the fields passed by name, no dict built)."""
        if not isinstance(data, dict):
            raise ValueError("the 'dispatch' argument must be an object")
        for name, kind in _REQUIRED:
            value = data.get(name)
            if not isinstance(value, kind) or value is True or value is False:
                raise ValueError(f"field '{name}' is missing or has the wrong type")
        meta = data.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise ValueError("field 'meta' must be an object")
        policy = data.get("policy", "")
        if not isinstance(policy, str):
            raise ValueError("field 'policy' must be a string")
        due = data.get("due", 0.0)
        if not isinstance(due, (int, float)) or due is True or due is False:
            raise ValueError("field 'due' must be a number")
        attempt, priority = data["attempt"], data["priority"]
        if attempt < 1 or not 0 <= priority <= 9:
            raise ValueError("field 'attempt' or 'priority' is out of range")
        trace = data.get("trace")
        _check_trace(trace)
        return cls(type=data["type"], lane=data["lane"], priority=priority, attempt=attempt,
                   deadline=data["deadline"], dispatched_at=data["dispatched_at"], chat=data["chat"],
                   key=data["key"], meta=meta, policy=policy, due=due, trace=trace)


def stored_ms(seconds: float) -> int:
    """An envelope's time (its deadline, its due time) as admission stores it in the record: whole epoch
    milliseconds, truncated (``lanes.lua.admit``). Two times within one millisecond are stored equal."""
    return int(seconds * 1000)


#: The fields every envelope carries, and the types each may have (a bool is never a number here).
_REQUIRED: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("type", str), ("lane", str), ("priority", int), ("attempt", int), ("deadline", (int, float)),
    ("dispatched_at", (int, float)), ("chat", str), ("key", str),
)

#: An envelope's ``trace`` holds at most this many keys, each value at most this many characters.
TRACE_MAX_KEYS = 8
TRACE_MAX_CHARS = 512


def _check_trace(value: Any) -> None:
    if value is None:
        return
    if (not isinstance(value, dict) or len(value) > TRACE_MAX_KEYS
            or not all(isinstance(k, str) and isinstance(v, str) and len(v) <= TRACE_MAX_CHARS
                       for k, v in value.items())):
        raise ValueError(f"field 'trace' must be an object of at most {TRACE_MAX_KEYS} strings "
                         f"(of up to {TRACE_MAX_CHARS} characters each)")


_EMBED_JSON = orjson.dumps(_EMBED).decode()


def _json(value: Any) -> str:
    """Compact JSON of a validated value: orjson, or ``lanes.jsontext`` for what orjson refuses (a dict key
    that is not a str, an int past 64 bits: validation took them as ``json`` does)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return jsontext.dumps(value)


@functools.lru_cache(maxsize=1024)
def _headers(handler: str, type_name: str) -> dict[str, Any]:
    """The headers a task type's messages share, the per-task ones None: copied and filled per message
    (building the dict anew was a third of a message's CPU)."""
    return {"lang": "py", "task": handler, "id": None, "shadow": type_name, "retries": None, "timelimit": None,
            "root_id": None, "argsrepr": "()", "kwargsrepr": None, LEASED_HEADER: True, RECORD_HEADER: None}


def build_message(task_id: str, handler: str, payload_json: str, envelope: Envelope, soft_limit_s: float,
                  grace_s: float | None = None) -> str:
    """The task's message as its record stores it: three lines of compact JSON, the only parts that
    cannot be rebuilt (``["<handler>",<hard limit>,<soft limit>]``, the payload, the envelope).

    A waiting task's bytes are mostly its message, so Redis keeps only these (about a quarter of
    kombu's envelope); :func:`kombu_message` writes the rest when a worker pops it. JSON text has
    no raw newline, so the lines split without parsing. ``task_id`` is the record's (its key ends
    with it) and is not stored again. ``grace_s``: ``hard_limit_grace_s()``, when the caller has
    it (a bulk dispatch reads the settings once a chunk, not once an item).
    """
    hard = soft_limit_s + (hard_limit_grace_s() if grace_s is None else grace_s)
    return f"{_json([handler, hard, soft_limit_s])}\n{payload_json}\n{_json(envelope.as_dict())}"


def stored_parts(stored: bytes | str) -> tuple[str, float, float, str, str]:
    """(handler, hard limit, soft limit, payload JSON, envelope JSON) of a stored message; ValueError
    when it is not one."""
    text = stored.decode("utf-8") if isinstance(stored, bytes) else stored
    parts = text.split("\n", 2)
    if len(parts) != 3:
        raise ValueError("not a stored message (three lines of JSON)")
    head = orjson.loads(parts[0])
    if not (isinstance(head, list) and len(head) == 3 and isinstance(head[0], str)):
        raise ValueError("a stored message's first line must be [handler, hard limit, soft limit]")
    return head[0], head[1], head[2], parts[1], parts[2]


@dataclass(slots=True)
class Written:
    """A stored message written out for delivery (:func:`written_message`): kombu's envelope, and the two
    parts of its body as the writing read them, so a reader in the same process (``tasks.grouping``'s
    runner) parses the payload once and the envelope not again. ``envelope`` is None for an older record
    that holds the whole message: its reader parses the body."""

    raw: dict[str, Any]
    payload_json: str = ""
    envelope: dict[str, Any] | None = None


#: The attribute of a kombu ``Message`` (it has a ``__dict__``) under which ``lanes.transport`` hands its
#: :class:`Written` to a taker in the same process (:func:`written_of`).
WRITTEN_ATTRIBUTE = "dispatch_written"


def written_of(message: Any) -> Written | None:
    """The :class:`Written` a delivered message was made from, when the transport handed it on; None else
    (a message kombu's own delivery made, or one from elsewhere: its reader parses the body)."""
    written = getattr(message, WRITTEN_ATTRIBUTE, None)
    return written if isinstance(written, Written) else None


def kombu_message(stored: bytes | str, task_id: str, record: str, delivery_tag: str) -> dict[str, Any]:
    """The Celery (protocol 2) message in kombu's Redis envelope, as kombu's ``Channel._put`` would
    have written it, from a record's stored message: what a worker delivers, Flower and ``celery
    inspect`` show, and Celery's ``Request`` reads (its empty or default headers, ``eta``,
    ``expires``, ``group``, ``parent_id``, ``ignore_result``, ... and the properties' reply-to, left
    out: it reads each with ``.get`` and its default).

    ``shadow`` carries the task type: the worker's log, its task events and so Flower name the task
    ``chat.send`` rather than its handler ``http.post``. A record written before messages were stored
    compact holds the whole message with a NUL where the tag goes: it is read as it is.
    """
    return written_message(stored, task_id, record, delivery_tag).raw


def written_message(stored: bytes | str, task_id: str, record: str, delivery_tag: str) -> Written:
    """:func:`kombu_message`, with the payload's text and the envelope it parsed to write the headers."""
    if (isinstance(stored, bytes) and stored[:1] == b"{") or (isinstance(stored, str) and stored[:1] == "{"):
        whole = stored.encode() if isinstance(stored, str) else stored
        return Written(orjson.loads(whole.replace(b"\0", delivery_tag.encode())))
    handler, hard, soft, payload_json, envelope_json = stored_parts(stored)
    env = _loads(envelope_json)
    headers = _headers(handler, env["type"]).copy()
    headers["id"] = headers["root_id"] = task_id
    headers["retries"] = env["attempt"] - 1
    headers["timelimit"] = [hard, soft]
    headers["kwargsrepr"] = _short_repr(payload_json, env["attempt"], env.get("chat") or "")
    headers[RECORD_HEADER] = record
    raw = {"body": f'[[],{{"payload":{payload_json},"dispatch":{envelope_json}}},{_EMBED_JSON}]',
           "content-encoding": "utf-8", "content-type": "application/json", "headers": headers,
           "properties": {"delivery_info": {"exchange": "", "routing_key": keys.lane_queue(env["lane"], 0)},
                          "priority": to_kombu(env["priority"]), "body_encoding": "utf-8",
                          "delivery_tag": delivery_tag}}
    return Written(raw, payload_json, env)


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # an int past 64 bits in ``meta``: json reads what it wrote
        return json.loads(text)


def listed_message(client: Any, item: bytes) -> dict[str, Any] | None:
    """The kombu message a lane list's item stands for (a record's reference ``<record>#<publish>``,
    or a whole message pushed back as it is), read as ``pop_more.lua`` does; None when its record is
    gone. For tools and tests that look into a lane without popping."""
    if item[:1] == b"{":
        return orjson.loads(item)
    record, _, pub = item.decode().rpartition(LIST_ITEM_SEPARATOR)
    stored = client.hget(record, "msg")
    if stored is None:
        return None
    task_id = record.rsplit(":", 1)[1]
    return kombu_message(stored, task_id, record, f"{task_id}.{pub}")


def _short_repr(payload_json: str, attempt: int, chat: str) -> str:
    shown = payload_json if len(payload_json) <= 200 else payload_json[:197] + "..."
    shown_chat = f", chat={chat!r}" if chat else ""
    return f"{{payload: {shown}, attempt={attempt}{shown_chat}}}"
