"""Builds Celery (protocol 2) messages in kombu's Redis envelope, ready for Lua to push.

Dispatch publishes from inside its admission script, so admission and publish
are one atomic Redis call: there is no window in which a task is accepted but
not in the broker. The envelope is what kombu's ``Channel._put`` would write;
the delivery tag is left as a NUL byte for the script to fill in per publish
(JSON escapes NUL in strings, so the raw byte cannot occur elsewhere).
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings

from lanes import jsontext, keys
from lanes.priorities import to_kombu
from lanes.transport import LEASED_HEADER, RECORD_HEADER

_ORIGIN = f"dispatch@{socket.gethostname()}:{os.getpid()}"
#: The body's third part (Celery's callbacks, errbacks, chain, chord): none, so empty. Celery reads each
#: with ``embed.get`` (and the headers and properties a message leaves out, at their defaults, with
#: ``.get``): every byte of a message is kept twice while its task waits (BENCHMARKS.md).
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
        """Parse a received envelope; raise ValueError naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError("the 'dispatch' argument must be an object")
        expected: dict[str, type | tuple[type, ...]] = {
            "type": str, "lane": str, "priority": int, "attempt": int,
            "deadline": (int, float), "dispatched_at": (int, float), "chat": str, "key": str,
        }
        for name, kind in expected.items():
            value = data.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"field '{name}' is missing or has the wrong type")
        meta = data.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise ValueError("field 'meta' must be an object")
        if not isinstance(data.get("policy", ""), str):
            raise ValueError("field 'policy' must be a string")
        due = data.get("due", 0.0)
        if not isinstance(due, (int, float)) or isinstance(due, bool):
            raise ValueError("field 'due' must be a number")
        if data["attempt"] < 1 or not 0 <= data["priority"] <= 9:
            raise ValueError("field 'attempt' or 'priority' is out of range")
        _check_trace(data.get("trace"))
        return cls(**{name: data[name] for name in (*expected, "meta", "policy", "due", "trace") if name in data})


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


#: The message's delivery tag: a raw NUL for the admission script to fill in per publish (written as is:
#: orjson writes a Fragment's bytes without looking at them).
_DELIVERY_TAG = orjson.Fragment(b'"\0"')
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
            "root_id": None, "argsrepr": "()", "kwargsrepr": None, "origin": _ORIGIN, LEASED_HEADER: True,
            RECORD_HEADER: None}


@functools.lru_cache(maxsize=1024)
def _properties(lane: str, kombu_priority: int) -> dict[str, Any]:
    """kombu's properties of a lane's messages at one priority (no correlation id, reply-to or delivery
    mode: nothing replies to a lane's message, and Redis has one delivery mode)."""
    return {"delivery_info": {"exchange": "", "routing_key": keys.lane_queue(lane, 0)},
            "priority": kombu_priority, "body_encoding": "utf-8", "delivery_tag": _DELIVERY_TAG}


def build_message(task_id: str, handler: str, payload_json: str, envelope: Envelope, soft_limit_s: float,
                  grace_s: float | None = None) -> str:
    """The message as compact JSON (orjson) with a NUL byte where the delivery tag goes.

    ``shadow`` carries the task type: the worker's log, its task events and so
    Flower name the task ``chat.send`` rather than its handler ``http.post``
    and the result row's ``task_name`` (tasks.results) too.
    ``grace_s``: ``hard_limit_grace_s()``, when the caller has it (a bulk
    dispatch reads the settings once a chunk, not once an item).

    The body is Celery's ``[args, kwargs, embed]``, the payload's text (already
    JSON, from validation) placed in it as it is. Text is written as UTF-8, not
    escaped: ``pop_more.lua`` finds the record's key in the raw message
    (``"dispatch_record":"<key>"``) and ``claim_batch.lua`` decodes it with cjson.
    """
    headers = _headers(handler, envelope.type).copy()
    headers["id"] = headers["root_id"] = task_id
    headers["retries"] = envelope.attempt - 1
    headers["timelimit"] = [soft_limit_s + (hard_limit_grace_s() if grace_s is None else grace_s), soft_limit_s]
    headers["kwargsrepr"] = _short_repr(payload_json, envelope)
    headers[RECORD_HEADER] = keys.task_record(task_id, envelope.chat or None)
    properties = _properties(envelope.lane, to_kombu(envelope.priority))
    body = f'[[],{{"payload":{payload_json},"dispatch":{_json(envelope.as_dict())}}},{_EMBED_JSON}]'
    return orjson.dumps({"body": body, "content-encoding": "utf-8", "content-type": "application/json",
                         "headers": headers, "properties": properties}).decode()


def _short_repr(payload_json: str, envelope: Envelope) -> str:
    shown = payload_json if len(payload_json) <= 200 else payload_json[:197] + "..."
    chat = f", chat={envelope.chat!r}" if envelope.chat else ""
    return f"{{payload: {shown}, attempt={envelope.attempt}{chat}}}"
