"""A task's own history (dispatched, each attempt, retries, cancel, dead letter, result) and its progress.

Why it is built this way: the worker's steps are one Redis call each and must
stay so (the Redis budget, docs/redis-budget.md). So nothing here runs inside
those calls or waits on Redis: an event (``started``, ``succeeded``,
``retry``, ...) is a line of JSON appended to an in-process buffer, and one
daemon thread per process writes the buffer every :data:`FLUSH_EVERY_S` in one
pipelined round trip. A task's events are text under its own key
(``keys.task_history``: by task id alone, so it outlives the record), one JSON
event a line (``events_of`` reads them). The first write is one ``SET ... EX NX``
that creates the key with its expiry (``DISPATCH_HISTORY_TTL_S``, else as long
as the result row: Celery's ``result_expires``), each later one an ``APPEND``,
which keeps it: a task that starts and ends within one flush costs one command
and no round trip of its own (a list cost an ``RPUSH`` and an ``EXPIRE``). A
``SET`` that finds the key made by another process appends in a second round
trip; a key still holding a list (written before this format) is pushed onto
as before.

The events a task's worker still holds when it stores a final result row (a
success or a dead letter of a type that keeps one, ``store_result``) ride in that
row instead (``take_for_row``: its ``meta``, under :data:`ROW_META_KEY`, the same
text), so a task that starts and ends within one flush costs its history no Redis
command at all; only events flushed before (a task running across a flush, earlier
attempts) are in the key. ``tasks.history_view`` reads the key, then the row. Done
only while rows live at least as long as histories (``rows_outlive_history``); the
reader hides a row's events past the history's retention. A row stored again
without events (a finished task's copy redelivered) keeps the ones it has
(``tasks.results``).

An attempt adds at most one event per delivery
(``DISPATCH_MAX_DELIVERIES``) and one for its end, so a history stays short;
from attempt :data:`TRIM_FROM_ATTEMPT` on, each write also trims it to its last
:data:`HISTORY_MAX` events.

``ctx.progress(fraction, note)`` is the same: the handler's thread only keeps
the latest value; the thread writes it (one ``SET`` with the same expiry) at
most once per :data:`PROGRESS_EVERY_S` per task, and the last value at the end
of the attempt.

What it costs: a reader sees an event up to a flush late (a row's, once the row is stored: the same moment
the task's outcome shows); a row carries the events as text in its ``meta`` (Celery's result meta shows
them under :data:`ROW_META_KEY`); a process killed
with SIGKILL loses its last flush of events (the task's state, its dead letter
and its result row are elsewhere and are read beside the events, so the page
still says how it ended). A task that never reached a worker (expired,
cancelled while it waited) has no ``started`` event: 0 attempts.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import orjson
from django.conf import settings
from redis.exceptions import ResponseError, WatchError

from lanes import keys
from lanes.flusher import Flusher
from lanes.forksafe import ForkSafeLock
from lanes.messages import stored_parts
from tasks.owners import owner_of

logger = logging.getLogger(__name__)

#: Seconds between two writes of the buffered events and progress.
FLUSH_EVERY_S = 0.2
#: Least seconds between two progress writes of one task (the last value is always written).
PROGRESS_EVERY_S = 0.5
#: Longest progress note, in characters.
NOTE_MAX = 200
#: Events kept per task (the latest); a task's list is trimmed once its attempts reach TRIM_FROM_ATTEMPT.
HISTORY_MAX = 100
TRIM_FROM_ATTEMPT = 20
#: Events buffered at most while Redis does not take them; more are dropped (statistics, not state).
PENDING_MAX = 50_000
#: Seconds a history is kept when Celery keeps results forever (``result_expires`` None).
DEFAULT_RETENTION_S = 30 * 86400
#: The result row's ``meta`` field that carries the events its worker still held when it stored the row.
ROW_META_KEY = "dispatch_history"
#: The row states whose row carries events: final, never replaced by a later attempt's row (a RETRY row is,
#: so its events go to Redis). A cancel's REVOKED row is stored before its ``cancelled`` event is noted.
ROW_STATES = frozenset({"SUCCESS", "FAILURE"})


class InvalidProgress(ValueError):
    """A ``ctx.progress`` value that cannot be shown: the message says which and why."""


def check_progress(fraction: Any, note: Any = None) -> tuple[float, str]:
    """``(fraction, note)`` as stored, or ``InvalidProgress`` naming what is wrong (pure)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise InvalidProgress(f"progress fraction must be a number from 0 to 1, not {type(fraction).__name__}")
    value = float(fraction)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidProgress(f"progress fraction must be from 0 to 1, got {value!r}")
    if note is None:
        return value, ""
    if not isinstance(note, str):
        raise InvalidProgress(f"progress note must be text, not {type(note).__name__}")
    if len(note) > NOTE_MAX:
        raise InvalidProgress(f"progress note is {len(note)} characters; at most {NOTE_MAX}")
    if not note.isprintable():
        raise InvalidProgress("progress note must be printable text (no newlines, tabs or control characters)")
    return value, note


# -- writing ------------------------------------------------------------------

_lock = ForkSafeLock()
#: task id -> events (JSON text) not yet written, in order.
_events: dict[str, list[str]] = {}
#: task ids whose history key this process knows exists with its expiry (made or found by its writes).
_expiring: set[str] = set()
#: task ids whose history may have grown long (a late attempt): trimmed at the next write.
_trim: set[str] = set()
#: task id -> (progress JSON, final): the latest value not yet written; final: write it now.
_progress: dict[str, tuple[str, bool]] = {}
#: task id -> when its progress was last written (monotonic).
_progress_at: dict[str, float] = {}
_count = 0


def note(task_id: str, kind: str, *, attempt: int = 0, at: float | None = None, **fields: Any) -> None:
    """Keep one event of ``task_id`` for the next flush; never raises, never waits on Redis."""
    global _count
    try:
        event = {"kind": kind, "at": round(time.time() if at is None else at, 3), **fields}
        if attempt:
            event["attempt"] = attempt
        # Micro-optimization: orjson (a dependency already), 3 events a task on the hot path.
        line = orjson.dumps(event, default=str).decode()
    except Exception:  # history must never break the task
        logger.warning("history_event_dropped task=%s kind=%s", task_id, kind, exc_info=True)
        return
    with _lock:
        if _count >= PENDING_MAX:
            return
        _events.setdefault(task_id, []).append(line)
        _count += 1
        if attempt >= TRIM_FROM_ATTEMPT:
            _trim.add(task_id)
    _flusher.ensure()


def report_progress(task_id: str, fraction: Any, note_text: Any = None) -> None:
    """Keep a running task's latest progress; the flush writes it (rate-limited). Raises InvalidProgress."""
    value, text = check_progress(fraction, note_text)
    line = json.dumps({"fraction": value, "note": text, "at": round(time.time(), 3)})
    with _lock:
        _progress[task_id] = (line, False)
    _flusher.ensure()


def attempt_ended(task_id: str) -> None:
    """The attempt is over: its last progress is written at the next flush, whatever the rate."""
    with _lock:
        pending = _progress.get(task_id)
        if pending is not None:
            _progress[task_id] = (pending[0], True)
        else:
            _progress_at.pop(task_id, None)


def retention_s() -> int:
    """``DISPATCH_HISTORY_TTL_S``, else as long as the result row (Celery's ``result_expires``)."""
    from celery import current_app  # inner import: celery's app is the worker's, read when flushing

    if getattr(settings, "DISPATCH_HISTORY_TTL_S", 0) > 0:
        return int(settings.DISPATCH_HISTORY_TTL_S)

    expires = current_app.conf.result_expires
    if isinstance(expires, dt.timedelta):
        return max(1, int(expires.total_seconds()))
    if isinstance(expires, (int, float)) and expires > 0:
        return int(expires)
    return DEFAULT_RETENTION_S


def _result_expires_s() -> float | None:
    """Seconds Celery keeps a result row (``result_expires``); None: forever (no cleanup deletes it)."""
    from celery import current_app  # inner import: as in retention_s

    expires = current_app.conf.result_expires
    if isinstance(expires, dt.timedelta):
        expires = expires.total_seconds()
    return float(expires) if isinstance(expires, (int, float)) and expires > 0 else None


def rows_outlive_history() -> bool:
    """Whether a result row lives at least as long as a history (``retention_s``): only then may it carry events."""
    expires = _result_expires_s()
    return expires is None or expires >= retention_s()


def take_for_row(task_id: str, state: str) -> str:
    """The events of ``task_id`` not yet written, taken out of the buffer for its result row in ``state``
    (the row's ``meta[ROW_META_KEY]``, one JSON event a line); '' when none or the row must not carry them.

    The caller stores the row and gives the text back (``give_back``) if it could not: then the flush
    writes it to Redis as before. Never raises, never waits on Redis."""
    return take_for_rows([(task_id, state)])[0]


def take_for_rows(rows: Sequence[tuple[str, str]], outlive: bool | None = None) -> list[str]:
    """:func:`take_for_row` for each (task id, state) of a group's rows, the configuration read once
    (``outlive``: :func:`rows_outlive_history` as its caller read it; None: read here)."""
    global _count
    with _lock:
        wanted = [state in ROW_STATES and task_id in _events for task_id, state in rows]
    if not any(wanted):
        return [""] * len(rows)
    try:
        if not (rows_outlive_history() if outlive is None else outlive):
            return [""] * len(rows)
    except Exception:  # noqa: BLE001 - the configuration unreadable: the key, as before
        return [""] * len(rows)
    texts = []
    with _lock:
        for (task_id, _state), want in zip(rows, wanted, strict=True):
            lines = _events.pop(task_id, None) if want else None
            if lines:
                _count -= len(lines)
                _trim.discard(task_id)  # nothing is added to its key this time
            texts.append(lines)
    return [_text_of(lines) if lines else "" for lines in texts]


def give_back(task_id: str, text: str) -> None:
    """Events ``take_for_row`` took for a row that was not stored: first in line for the next flush."""
    global _count
    lines = events_of(text)
    if not lines:
        return
    with _lock:
        _events[task_id] = lines + _events.get(task_id, [])
        _count += len(lines)
    _flusher.ensure()


def events_of(raw: bytes | str | None) -> list[str]:
    """The events (JSON text, in order) of a history key's text: one a line (pure)."""
    if not raw:
        return []
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    return [line for line in text.split("\n") if line]


def _text_of(lines: list[str]) -> str:
    """Events as a history key holds them: each line ends in a newline (orjson never writes one inside)."""
    return "\n".join(lines) + "\n"


#: One flush at a time in a process (its thread, an exit hook, a cancel's): a task's events land in order.
_flush_lock = ForkSafeLock()


def flush(client: Any = None) -> int:
    """Write what is buffered in one pipelined call; returns the events written. Kept for the next call on failure."""
    with _flush_lock:
        return _flush(client)


def _flush(client: Any) -> int:
    global _count
    now = time.monotonic()
    with _lock:
        events = dict(_events)
        _events.clear()
        _count = 0
        progress = {}
        for task_id, (line, final) in list(_progress.items()):
            if final or now - _progress_at.get(task_id, -math.inf) >= PROGRESS_EVERY_S:
                progress[task_id] = (line, final)
                del _progress[task_id]
        known = {t for t in events if t in _expiring}
        trim = set(_trim)
        _trim.clear()
    if not events and not progress:
        return 0
    if client is None:
        from lanes.redis_client import get_redis  # inner import: as lanes.counters, light for importers

        client = get_redis()
    ttl = retention_s()
    texts = {task_id: _text_of(lines) for task_id, lines in events.items()}
    pipe = client.pipeline(transaction=False)
    for task_id, text in texts.items():
        if task_id in known:
            pipe.append(keys.task_history(task_id), text)
        else:
            pipe.set(keys.task_history(task_id), text, ex=ttl, nx=True)
    for task_id, (line, _final) in progress.items():
        pipe.set(keys.task_progress(task_id), line, ex=ttl)
    unwritten = events
    try:
        replies = pipe.execute(raise_on_error=False)
        unwritten = {}
        _rounds_after(client, events, texts, known, replies[:len(events)], ttl, unwritten)
        for task_id in trim & set(events):
            _trim_history(client, keys.task_history(task_id))
    except Exception:
        with _lock:
            for task_id, lines in unwritten.items():
                if _count < PENDING_MAX:
                    _events[task_id] = lines + _events.get(task_id, [])
                    _count += len(lines)
            if unwritten is events:
                for task_id, entry in progress.items():
                    _progress.setdefault(task_id, entry)
            _trim.update(trim)
        logger.warning("history_flush_failed tasks=%d", len(unwritten), exc_info=True)
        return 0
    with _lock:
        _expiring.update(events)
        for task_id, (_line, final) in progress.items():
            if final:
                _progress_at.pop(task_id, None)
            else:
                _progress_at[task_id] = now
        if len(_expiring) > PENDING_MAX:  # a long-lived process: forget, at worst a second round more
            _expiring.clear()
    return sum(len(lines) for lines in events.values())


def _rounds_after(client: Any, events: dict[str, list[str]], texts: dict[str, str], known: set[str],
                  replies: list[Any], ttl: int, unwritten: dict[str, list[str]]) -> None:
    """What the first round could not write (rare): a ``SET NX`` that found the key (another process made
    it) appends; an ``APPEND`` that made it (it had expired) sets its expiry; a key holding a list (the
    format before) is pushed onto. ``unwritten`` holds the events not written yet, for the flush to keep
    if this raises (a Redis error other than a list's ``WRONGTYPE``)."""
    def refused(reply: Any) -> bool:
        if isinstance(reply, ResponseError) and "WRONGTYPE" not in str(reply):
            raise reply
        return isinstance(reply, ResponseError)

    appends, pushes, made = [], [], []
    for (task_id, lines), reply in zip(events.items(), replies, strict=True):
        if isinstance(reply, ResponseError) or (task_id not in known and reply is None):
            unwritten[task_id] = lines
        if refused(reply):
            pushes.append(task_id)
        elif task_id not in known and reply is None:
            appends.append(task_id)
        elif task_id in known and reply == len(texts[task_id].encode()):
            made.append(task_id)
    for task_id in made:
        client.expire(keys.task_history(task_id), ttl)
    if appends:
        pipe = client.pipeline(transaction=False)
        for task_id in appends:
            pipe.append(keys.task_history(task_id), texts[task_id])
        pushes += [t for t, reply in zip(appends, pipe.execute(raise_on_error=False), strict=True) if refused(reply)]
        for task_id in set(appends) - set(pushes):
            del unwritten[task_id]
    if pushes:
        pipe = client.pipeline(transaction=False)
        for task_id in pushes:
            pipe.rpush(keys.task_history(task_id), *events[task_id])
        pipe.execute()
    unwritten.clear()


def _trim_history(client: Any, key: str) -> None:
    """Keep a long history's last ``HISTORY_MAX`` events (its expiry kept); a write racing it: next time."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            if pipe.type(key) in (b"list", "list"):
                pipe.multi()
                pipe.ltrim(key, -HISTORY_MAX, -1)
            else:
                lines = events_of(pipe.get(key))
                if len(lines) <= HISTORY_MAX:
                    return
                pipe.multi()
                pipe.set(key, _text_of(lines[-HISTORY_MAX:]), keepttl=True)
            pipe.execute()
        except WatchError:
            pass


_flusher = Flusher("history", FLUSH_EVERY_S, flush, lambda: bool(_events or _progress))
#: ``flush()`` for exit hooks and signal receivers: never raises.
flush_quietly = _flusher.flush_quietly


def _after_fork_in_child() -> None:
    global _count
    _events.clear()
    _progress.clear()
    _progress_at.clear()
    _expiring.clear()
    _trim.clear()
    _count = 0


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(flush_quietly)


# -- what the worker's steps note ------------------------------------------------

def dispatched_fields(env: Any) -> dict[str, Any]:
    """What the caller asked for, from a task's envelope (``lanes.messages.Envelope`` or its dict)."""
    get = env.get if isinstance(env, dict) else lambda name, default=None: getattr(env, name, default)
    at = get("dispatched_at") or 0.0
    options: dict[str, Any] = {"priority": get("priority")}
    deadline = get("deadline")
    if isinstance(deadline, (int, float)) and at:
        options["timeout_s"] = round(deadline - at, 3)
    for name, shown_as in (("chat", "chat_id"), ("key", "idempotency_key"), ("policy", "retry_policy")):
        if get(name):
            options[shown_as] = get(name)
    if get("due"):
        options["eta"] = get("due")
    if get("meta"):
        options["metadata"] = get("meta")
    return {"at": at, "type": get("type") or "", "lane": get("lane") or "", "options": options}


def started(task_id: str, env: Any, worker: str, now: float) -> None:
    """An attempt began on ``worker`` (the first also notes the dispatch it came from)."""
    if env.attempt == 1:
        fields = dispatched_fields(env)
        note(task_id, "dispatched", at=fields.pop("at"), by=owner_of(task_id), **fields)
    note(task_id, "started", attempt=env.attempt, at=now, worker=worker,
         waited_s=round(max(0.0, now - env.ready_at), 3))


def ended(task_id: str, attempt: int, outcome: str, at: float | None = None, **fields: Any) -> None:
    """An attempt (or the task) ended: ``succeeded``, ``retry``, ``dead`` or ``cancelled``."""
    note(task_id, outcome, attempt=attempt, at=at, **fields)
    attempt_ended(task_id)


def cancelled_waiting(cancelled: list[tuple[str, str]], detail: str) -> None:
    """Tasks a cancel removed while they waited, as ``(task id, record)``: what they were, then the cancel.

    Their records go next, so what the caller asked for is read from them now (one pipelined read;
    a cancel is rare) and written at once, for the reader who looks right after. Never raises.
    """
    from lanes.redis_client import get_redis  # inner import: as in flush

    try:
        client = get_redis()
        pipe = client.pipeline(transaction=False)
        for task_id, record in cancelled:
            pipe.hget(record, "msg")
            pipe.exists(keys.task_history(task_id))
        replies = pipe.execute()
        for (task_id, _record), msg, known in zip(cancelled, replies[::2], replies[1::2], strict=True):
            if msg and not known:
                fields = dispatched_fields(envelope_of(msg))
                note(task_id, "dispatched", at=fields.pop("at"), by=owner_of(task_id), **fields)
            ended(task_id, 0, "cancelled", detail=detail)
        flush()
    except Exception:  # history must never break a cancel
        logger.warning("history_of_cancel_not_written tasks=%d", len(cancelled), exc_info=True)


def envelope_of(msg: bytes | str) -> dict[str, Any]:
    """The envelope dict of a message stored in a task record (``lanes.messages.build_message``'s compact
    layout, or a whole message with a NUL for its tag as records written before it hold); {} if neither."""
    raw = msg if isinstance(msg, bytes) else msg.encode()
    if raw[:1] != b"{":
        try:
            envelope = orjson.loads(stored_parts(raw)[4])
        except ValueError:
            return {}
        return envelope if isinstance(envelope, dict) else {}
    outer = json.loads(raw.replace(b"\0", b"").decode("utf-8"))
    _args, kwargs, _embed = json.loads(outer["body"])
    envelope = kwargs.get("dispatch") if isinstance(kwargs, dict) else None
    return envelope if isinstance(envelope, dict) else {}
