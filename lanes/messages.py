"""Builds Celery (protocol 2) messages in kombu's Redis envelope, ready for Lua to push.

Dispatch publishes from inside its admission script, so admission and publish
are one atomic Redis call: there is no window in which a task is accepted but
not in the broker. The envelope is what kombu's ``Channel._put`` would write;
the delivery tag is left as a NUL byte for the script to fill in per publish
(JSON escapes NUL in strings, so the raw byte cannot occur elsewhere).
"""

from __future__ import annotations

import functools
import json
import os
import socket
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from lanes import keys
from lanes.priorities import to_kombu
from lanes.transport import LEASED_HEADER, RECORD_HEADER

_ORIGIN = f"dispatch@{socket.gethostname()}:{os.getpid()}"
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
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
        return cls(**{name: data[name] for name in (*expected, "meta", "policy", "due") if name in data})


#: JSON of a string as ``json.dumps`` writes it (ASCII, escaped): C, one call.
_string = json.encoder.encode_basestring_ascii
#: ``json.dumps(..., separators=(",", ":"))``'s encoder, built once (``json.dumps`` builds one per call).
_compact = json.JSONEncoder(separators=(",", ":"))
_EMBED_JSON = _compact.encode(_EMBED)


@functools.lru_cache(maxsize=256, typed=True)
def _number(value: float) -> str:
    """A number as ``json.dumps`` writes it (the message's numbers are finite).

    Cached (typed: 1 and 1.0 are written apart): a float's repr costs about a
    microsecond, and a bulk dispatch's items share their times (``tasks.bulk``).
    """
    return float.__repr__(value) if isinstance(value, float) else int.__repr__(int(value))


def _escaped(text: str) -> str:
    """``text`` as it appears inside a JSON string: ``_string`` without its quotes. JSON escapes each
    character on its own, so the escape of a concatenation is the concatenation of the escapes."""
    return _string(text)[1:-1]


def _inner_string(text: str) -> str:
    """The JSON string of ``text`` as it appears inside another JSON string."""
    return _escaped(_string(text))


def _envelope_json(envelope: Envelope) -> str:
    """``json.dumps(envelope.as_dict(), separators=(",", ":"))`` as it appears inside a JSON string (the
    message's body is one), written directly and escaped as it is written: escaping the body after it
    was written was a tenth of a bulk dispatch's CPU an item.
    """
    q = '\\"'
    meta = "null" if envelope.meta is None else _escaped(_compact.encode(envelope.meta))
    chat, key, empty = envelope.chat, envelope.key, q + q
    # No format spec on the ints (``{x:d}``): f-strings format a plain int much faster without one.
    text = (f'{_envelope_head(envelope.type, envelope.lane)}{q}priority{q}:{int(envelope.priority)},'
            f'{q}attempt{q}:{int(envelope.attempt)},{q}deadline{q}:{_number(envelope.deadline)},'
            f'{q}dispatched_at{q}:{_number(envelope.dispatched_at)},'
            f'{q}chat{q}:{_inner_string(chat) if chat else empty},'
            f'{q}key{q}:{_inner_string(key) if key else empty},{q}meta{q}:{meta}')
    if envelope.policy:
        text += f',{q}policy{q}:{_inner_string(envelope.policy)}'
    if envelope.due:
        text += f',{q}due{q}:{_number(envelope.due)}'
    return text + "}"


@functools.lru_cache(maxsize=1024)
def _envelope_head(type_name: str, lane: str) -> str:
    return f'{{\\"type\\":{_inner_string(type_name)},\\"lane\\":{_inner_string(lane)},'


@functools.lru_cache(maxsize=1024)
def _fixed(handler: str, type_name: str, lane: str, soft_limit_s: float, hard_limit_s: float) -> tuple[str, str, str]:
    """The text between a message's per-task parts that one task type's messages share (``build_message``):
    half of a message's CPU was writing them again for each task of a bulk dispatch."""
    after_body = (f'","content-encoding":"utf-8","content-type":"application/json",'
                  f'"headers":{{"lang":"py","task":{_string(handler)},"id":')
    after_id = (f',"shadow":{_string(type_name)},"eta":null,"expires":null,"group":null,"group_index":null,'
                f'"retries":')
    limits = f',"timelimit":[{_number(hard_limit_s)},{_number(soft_limit_s)}],"root_id":'
    return after_body, after_id, limits


@functools.lru_cache(maxsize=1024)
def _properties(lane: str, kombu_priority: int) -> str:
    return (f',"reply_to":"","delivery_mode":2,"delivery_info":{{"exchange":"","routing_key":'
            f'{_string(keys.lane_queue(lane, 0))}}},"priority":{int(kombu_priority)},'
            f'"body_encoding":"utf-8","delivery_tag":"\0"}}}}')


_AFTER_ROOT = ',"parent_id":null,"argsrepr":"()","kwargsrepr":'
_AFTER_REPR = (f',"origin":{_string(_ORIGIN)},"ignore_result":false,"replaced_task_nesting":0,'
               f'"stamped_headers":null,"stamps":{{}},"{LEASED_HEADER}":true,"{RECORD_HEADER}":')
#: The body's text around its payload and envelope, as it appears inside the message's ``body`` string.
_BODY_HEAD = '{"body":"[[],{\\"payload\\":'
_BODY_MID = ',\\"dispatch\\":'
_BODY_TAIL = f'}},{_escaped(_EMBED_JSON)}]'


def build_message(task_id: str, handler: str, payload_json: str, envelope: Envelope, soft_limit_s: float,
                  grace_s: float | None = None) -> str:
    """The message as a string with a NUL byte where the delivery tag goes.

    ``shadow`` carries the task type: the worker's log, its task events and so
    Flower name the task ``chat.send`` rather than its handler ``http.post``
    (the result row's ``task_name`` stays the handler, Celery's ``task``).
    ``grace_s``: ``hard_limit_grace_s()``, when the caller has it (a bulk
    dispatch reads the settings once a chunk, not once an item).

    The text is what ``json.dumps(message, separators=(",", ":"))`` writes for
    the message dict of ``message_dict`` (``tests/unit/test_messages.py`` holds
    them equal), assembled from its parts, the parts a task type's messages
    share written once (``_fixed``), the body written as it appears inside its
    JSON string: ``json.dumps`` of the whole took half of a bulk dispatch's CPU
    per item. ``pop_more.lua`` and ``claim_batch.lua`` read it as that JSON.
    """
    tid = _string(task_id)
    after_body, after_id, limits = _fixed(handler, envelope.type, envelope.lane, soft_limit_s,
                                          soft_limit_s + (hard_limit_grace_s() if grace_s is None else grace_s))
    return (
        f'{_BODY_HEAD}{_escaped(payload_json)}{_BODY_MID}{_envelope_json(envelope)}{_BODY_TAIL}'
        f'{after_body}{tid}{after_id}{int(envelope.attempt) - 1}{limits}{tid}{_AFTER_ROOT}'
        f'{_string(_short_repr(payload_json, envelope))}{_AFTER_REPR}'
        f'{_string(keys.task_record(task_id, envelope.chat or None))}}},"properties":{{"correlation_id":{tid}'
        f'{_properties(envelope.lane, to_kombu(envelope.priority))}'
    )


def message_dict(task_id: str, handler: str, payload_json: str, envelope: Envelope, soft_limit_s: float
                 ) -> dict[str, Any]:
    """The message ``build_message`` writes, as a dict (its delivery tag the NUL placeholder): the reference
    its text is checked against, kept beside it so that a field added to one is added to the other."""
    body = f'[[],{{"payload":{payload_json},"dispatch":{json.dumps(envelope.as_dict(), separators=(",", ":"))}}},' \
        f'{json.dumps(_EMBED, separators=(",", ":"))}]'
    headers: dict[str, Any] = {
        "lang": "py", "task": handler, "id": task_id, "shadow": envelope.type, "eta": None,
        "expires": None, "group": None, "group_index": None, "retries": envelope.attempt - 1,
        "timelimit": [soft_limit_s + hard_limit_grace_s(), soft_limit_s], "root_id": task_id,
        "parent_id": None, "argsrepr": "()", "kwargsrepr": _short_repr(payload_json, envelope),
        "origin": _ORIGIN, "ignore_result": False, "replaced_task_nesting": 0,
        "stamped_headers": None, "stamps": {}, LEASED_HEADER: True,
        RECORD_HEADER: keys.task_record(task_id, envelope.chat or None),
    }
    return {
        "body": body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": keys.lane_queue(envelope.lane, 0)},
            "priority": to_kombu(envelope.priority),
            "body_encoding": "utf-8",
            "delivery_tag": "\0",
        },
    }


def _short_repr(payload_json: str, envelope: Envelope) -> str:
    shown = payload_json if len(payload_json) <= 200 else payload_json[:197] + "..."
    chat = f", chat={envelope.chat!r}" if envelope.chat else ""
    return f"{{payload: {shown}, attempt={envelope.attempt}{chat}}}"
