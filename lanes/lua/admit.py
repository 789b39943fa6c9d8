"""``admit.lua``'s wrapper: admission of a chunk of one task type's dispatches (one, or many) in one call.

``dispatch.delay`` sends a chunk of one, ``dispatch_many`` chunks of many, the
same way: ``Calls`` (a ``ScriptStream``: a chunk a call, the next sent before
the last is read), ``Chunk`` for what the items share and an ``Item`` each.
Replies come back decoded, one named value an item (``Admitted``, ``Rejected``,
``Duplicate``, ``Conflict``, ``Stale``), or the ``RedisError`` its call met.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from redis.exceptions import RedisError, ResponseError

from lanes import counters, keys
from lanes.lua.loader import Packed, ScriptStream, bulk_strings
from lanes.lua.loader import utf8_length as _length
from lanes.messages import stored_ms

NAME = "admit"
#: admit.lua's layout (its header): the chunk's keys and arguments, then each item's arguments.
SHARED_KEYS, SHARED_ARGS, ITEM_ARGS = 21, 18, 9


class Chunk(NamedTuple):
    """What every item of one admit.lua call shares: one task type, its lane, one config version, one time."""

    version: str
    #: Epoch seconds, the chunk's admission time.
    now: float
    lane: str
    task_type: str
    accepting: bool
    capacity: int
    chat_queue_size: int
    idempotency_window_s: int
    queued_lease_ms: int
    #: A dead letter's requeue: its fixed task id already stored answers ``Duplicate``.
    replace_idempotency: bool = False
    #: The type's dedupe mode ('key', 'throttle', 'debounce': ``tasks.dedupe``) and its window.
    dedupe: str = "key"
    dedupe_window_ms: int = 0
    #: A debounce cancels the task it replaces as ``tasks.cancel`` does: its tombstone's life, its settle lease.
    tombstone_ttl_s: int = 0
    settle_lease_ms: int = 0
    #: The most tasks one token (ids ``tk<id>-``) may hold waiting in the lane (0: no share to hold it to).
    caller_quota: int = 0


@dataclass(slots=True)
class Item:
    """One dispatch of a chunk. ``chat``, ``idempotency_key`` and ``payload_digest`` are '' when it has none."""

    task_id: str
    message: str
    kombu_priority: int
    chat: str
    idempotency_key: str
    payload_digest: str
    #: Epoch seconds.
    deadline: float
    #: Its limit instance bases (``keys.limit_base``), in its type's order.
    limits: tuple[str, ...] = ()
    #: Epoch seconds a task sent for later is due at (0: now).
    due: float = 0.0
    #: The key a throttle or debounce goes by ('' none: admitted as plain).
    dedupe_key: str = ""


class EstimateInputs(NamedTuple):
    """The lane's figures admission's estimate reads (``tasks.estimate``), read once a call at most."""

    completed_this_minute: int
    completed_previous_minute: int
    busy_s_this_minute: float
    busy_s_previous_minute: float
    paused: bool
    live_consumers: int


class Admitted(NamedTuple):
    """Stored (and published, unless it waits behind its chat's head, a limit or its due time)."""

    position: int  # in its chat's queue (1: its head), else in the lane (depth + 1)
    depth: int  # the lane's tasks not claimed yet, before this one
    ahead: int  # the lane's tasks waiting before this one
    estimate: EstimateInputs
    waits_on: str = ""  # the limit instance base it waits on ('': none holds it)
    waiting_ahead: int = 0  # tasks waiting on that instance before it
    paused_ms: int = 0  # that instance's Retry-After pause left
    replaced: str = ""  # the task a debounce replaced (cancelled: its REVOKED row is the caller's to store)
    replaced_chat: str = ""  # that task's chat ('' none)


class Rejected(NamedTuple):
    reason: str  # lane_closed, lane_full, caller_quota, chat_queue_full
    depth: int


class Duplicate(NamedTuple):
    """Its idempotency key names a task stored before (or a requeue's task id exists), or a throttle's key
    the first task of its window: that one."""

    task_id: str


class Conflict(NamedTuple):
    """Its idempotency key names a task stored before with another payload."""

    task_id: str


class Stale(NamedTuple):
    """The config changed (its version in Redis is ``version``): nothing of the call was written."""

    version: str


Reply = Admitted | Rejected | Duplicate | Conflict | Stale


def reports_a_task(reply: Any) -> bool:
    """Whether a reply tells the caller of a stored task (``Admitted``, ``Duplicate``)."""
    return isinstance(reply, (Admitted, Duplicate))


#: Seconds a process reuses a lane's estimate inputs (nothing admission decides by) instead of reading
#: them again: 4 Redis commands a call, now one read a second per lane and process (of a serving lane:
#: ``_healthy``).
ESTIMATE_INPUTS_TTL_S = 1.0
#: lane -> (monotonic time read, minute, the inputs); a minute's change reads them again.
_estimate_inputs: dict[str, tuple[float, int, EstimateInputs]] = {}


def _cached_estimate(lane: str, now: float) -> EstimateInputs | None:
    cached = _estimate_inputs.get(lane)  # one dict read or write is atomic: no lock around either
    if cached is not None and cached[1] == int(now // 60) and time.monotonic() - cached[0] < ESTIMATE_INPUTS_TTL_S:
        return cached[2]
    return None


def _healthy(inputs: EstimateInputs) -> bool:
    """A reading worth reusing: the lane is not paused and has a live consumer.

    A paused lane or one without consumers (the estimate then says why there is
    none) is read again at each call, so that a resume or a worker that starts
    shows at once; only a lane that was serving can look so for up to
    ``ESTIMATE_INPUTS_TTL_S`` after it stopped.
    """
    return not inputs.paused and inputs.live_consumers > 0


class Calls:
    """admit.lua's calls on one connection, a chunk each (``ScriptStream``); a context manager.

    The one way to call admit.lua: a lone ``dispatch.delay``'s chunk of one and
    ``dispatch_many``'s chunks alike (``tasks.bulk.Admission``). ``send`` a
    chunk, ``receive`` the oldest chunk's replies (one an item, in order). A
    stream of one chunk is one ``EVALSHA`` on the connection the process keeps
    between streams. Never raises: a reply is the ``RedisError`` its call met
    (``lanes.lua.loader.NotSent``: nothing of it was written).
    """

    def __init__(self) -> None:
        self._stream = ScriptStream(NAME)
        self._sent: deque[tuple[Chunk, int, EstimateInputs | None]] = deque()

    def __enter__(self) -> Calls:
        self._stream.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stream.__exit__(*exc_info)

    def send(self, chunk: Chunk, items: Sequence[Item]) -> None:
        cached = _cached_estimate(chunk.lane, chunk.now)
        self._stream.send(packed(chunk, items, read_estimate=cached is None))
        self._sent.append((chunk, len(items), cached))

    def receive(self) -> Sequence[Reply | RedisError]:
        chunk, count, cached = self._sent.popleft()
        reply = self._stream.receive()
        if isinstance(reply, RedisError):
            return [reply] * count
        try:
            return decode(reply, count, chunk, cached)
        except ValueError as exc:  # never expected: a script that answered out of shape stored unknown items
            return [ResponseError(str(exc))] * count

    def replicas_confirmed(self, replicas: int, timeout_ms: int) -> RedisError | None:
        """``ScriptStream.replicas_confirmed``: None when ``replicas`` replicas hold every write sent."""
        return self._stream.replicas_confirmed(replicas, timeout_ms)


def decode(reply: Any, count: int, chunk: Chunk, cached: EstimateInputs | None = None) -> list[Reply]:
    """admit.lua's reply (its header) for a call of ``count`` items, one named value an item.

    ``cached``: the estimate inputs the call was sent without (``read_estimate`` false); a reading the
    reply carries is kept for the next calls of this process when the lane is serving.
    """
    if isinstance(reply, list) and reply and reply[0] == b"stale":
        return [Stale(reply[1].decode())] * count
    if not isinstance(reply, list) or len(reply) != count + 1:
        raise ValueError(f"admit.lua answered {len(reply) - 1 if isinstance(reply, list) else reply!r} "
                         f"replies for {count} items")
    inputs, items = reply[0], reply[1:]
    estimate = cached
    if inputs:
        if len(inputs) != 6:
            raise ValueError(f"admit.lua answered estimate inputs out of shape ({inputs!r})")
        estimate = EstimateInputs(int(inputs[0]), int(inputs[1]), float(inputs[2]), float(inputs[3]),
                                  int(inputs[4]) == 1, int(inputs[5]))
        if _healthy(estimate):
            _estimate_inputs[chunk.lane] = (time.monotonic(), int(chunk.now // 60), estimate)
    out: list[Reply] = []
    for item in items:
        if isinstance(item, int):
            if estimate is None:  # never expected: the first item admitted reads them, unless they were cached
                raise ValueError("admit.lua answered 'ok' without the estimate inputs")
            out.append(Admitted(item + 1, item, item, estimate))
            continue
        status = item[0]
        if status == b"ok":
            if estimate is None:
                raise ValueError("admit.lua answered 'ok' without the estimate inputs")
            if len(item) > 7:
                out.append(Admitted(int(item[1]), int(item[2]), int(item[3]), estimate, item[4].decode(),
                                    int(item[5]), int(item[6]), item[7].decode(), item[8].decode()))
            elif len(item) > 4:
                out.append(Admitted(int(item[1]), int(item[2]), int(item[3]), estimate, item[4].decode(),
                                    int(item[5]), int(item[6])))
            else:
                out.append(Admitted(int(item[1]), int(item[2]), int(item[3]), estimate))
        elif status == b"rej":
            out.append(Rejected(item[1].decode(), int(item[2])))
        elif status == b"dup":
            out.append(Duplicate(item[1].decode()))
        elif status == b"conflict":
            out.append(Conflict(item[1].decode()))
        else:
            raise ValueError(f"admit.lua answered {status!r} for an item")
    return out


def count_dispatched(lane: str, task_type: str, now: float, amount: int = 1) -> None:
    """Count ``amount`` tasks of ``task_type`` dispatched into ``lane`` at ``now``, in process (``lanes.counters``),
    once a chunk."""
    counters.add(f"dispatched|{lane}|{task_type}", now, amount)


def shared_keys(chunk: Chunk) -> list[str]:
    """admit.lua's chunk keys, in its header's order."""
    minute = int(chunk.now // 60)
    return [keys.CONFIG_VERSION, keys.LEASES, keys.lane_chat_waiting(chunk.lane), keys.lane_delayed(chunk.lane),
            keys.METRICS_TOTAL, keys.metrics_minute(minute), keys.metrics_minute(minute - 1), keys.chat_index(),
            keys.DEADLINES, keys.PAUSED_LANES, keys.lane_consumers(chunk.lane), *keys.lane_queues(chunk.lane)]


def shared_args(chunk: Chunk, read_estimate: bool) -> list[Any]:
    """admit.lua's chunk arguments, in its header's order."""
    return [chunk.version, int(chunk.now * 1000), chunk.lane, chunk.task_type, "1" if chunk.accepting else "0",
            chunk.capacity, chunk.chat_queue_size, chunk.idempotency_window_s, chunk.queued_lease_ms,
            "1" if chunk.replace_idempotency else "0", keys.LIMIT_PREFIX, keys.LANE_PREFIX,
            "1" if read_estimate else "0", chunk.dedupe, chunk.dedupe_window_ms, chunk.tombstone_ttl_s,
            chunk.settle_lease_ms, chunk.caller_quota]


def packed(chunk: Chunk, items: Sequence[Item], *, read_estimate: bool = True) -> Packed:
    """admit.lua's keys and arguments for ``items`` already in Redis' protocol, for ``ScriptStream.send``.

    An item's keys are its record's, then those of its idempotency key and its
    chat if it has them (one key for a plain item). Written as text an item at a
    time: hiredis packed each of an item's arguments on its own, a tenth of a bulk
    dispatch's CPU an item. ``tests/support/admit_reference.py`` builds the same
    call argument by argument; a property test holds the two equal, byte for byte.
    """
    task_type = chunk.task_type
    key_text: list[str] = [_shared_keys_text(chunk.lane, int(chunk.now // 60))]
    arg_text: list[str] = []
    count = 0
    task_record, idempotency, legacy, chat_queue = (keys.task_record, keys.idempotency, keys.legacy_idempotency,
                                                    keys.chat_queue)
    for item in items:
        task_id, chat, key, message = item.task_id, item.chat, item.idempotency_key, item.message
        record = task_record(task_id, chat or None)
        key_text.append(f"${_length(record)}\r\n{record}\r\n")
        digest = item.payload_digest if key else ""
        if digest:
            key_text.append(bulk_strings((idempotency(task_type, key), legacy(task_type, key))))
            count += 2
        if chat:
            key_text.append(bulk_strings((chat_queue(chat),)))
            count += 1
        dedupe = "1" if item.dedupe_key else ""
        if dedupe:
            key_text.append(bulk_strings((keys.dedupe(task_type, item.dedupe_key),)))
            count += 1
        limits = item.limits
        limit_text = "\n".join(limits) if limits else ""
        deadline, due = _ms(item.deadline), _ms(item.due)
        priority = _DIGITS[item.kombu_priority]
        arg_text.append(
            f"${_length(task_id)}\r\n{task_id}\r\n${_length(message)}\r\n{message}\r\n"
            f"${len(priority)}\r\n{priority}\r\n${_length(chat)}\r\n{chat}\r\n${len(digest)}\r\n{digest}\r\n"
            f"${len(deadline)}\r\n{deadline}\r\n${_length(limit_text)}\r\n{limit_text}\r\n"
            f"${len(due)}\r\n{due}\r\n${len(dedupe)}\r\n{dedupe}\r\n")
    numkeys = SHARED_KEYS + len(items) + count
    text = "".join(key_text) + _shared_args_text(chunk, read_estimate) + "".join(arg_text)
    return Packed(numkeys, numkeys + SHARED_ARGS + ITEM_ARGS * len(items), text.encode())


def _shared_args_text(chunk: Chunk, read_estimate: bool) -> str:
    """``shared_args`` in Redis' protocol, written at once (the test holds it to ``shared_args``): the config
    version and the time, then the rest, which a type's calls share (a lookup: writing it was a quarter of a
    lone dispatch's packing)."""
    version, now_ms = chunk.version, str(int(chunk.now * 1000))
    return (f"${_length(version)}\r\n{version}\r\n${len(now_ms)}\r\n{now_ms}\r\n"
            f"{_shared_args_after_now(chunk[2:], read_estimate)}")


@functools.lru_cache(maxsize=1024)
def _shared_args_after_now(after: tuple[Any, ...], read_estimate: bool) -> str:
    """``shared_args`` from the lane on, of a chunk whose fields from ``lane`` on are ``after``."""
    chunk = Chunk("", 0.0, *after)
    lane, task_type = chunk.lane, chunk.task_type
    capacity, size = str(int(chunk.capacity)), str(int(chunk.chat_queue_size))
    window, lease = str(int(chunk.idempotency_window_s)), str(int(chunk.queued_lease_ms))
    quota = str(int(chunk.caller_quota))
    return (f"${_length(lane)}\r\n{lane}\r\n${_length(task_type)}\r\n{task_type}\r\n"
            f"$1\r\n{'1' if chunk.accepting else '0'}\r\n${len(capacity)}\r\n{capacity}\r\n"
            f"${len(size)}\r\n{size}\r\n${len(window)}\r\n{window}\r\n${len(lease)}\r\n{lease}\r\n"
            f"$1\r\n{'1' if chunk.replace_idempotency else '0'}\r\n{_PREFIXES_TEXT}"
            f"$1\r\n{'1' if read_estimate else '0'}\r\n"
            f"{_dedupe_args_text(chunk.dedupe, chunk.dedupe_window_ms, chunk.tombstone_ttl_s, chunk.settle_lease_ms)}"
            f"${len(quota)}\r\n{quota}\r\n")


@functools.lru_cache(maxsize=256)
def _dedupe_args_text(dedupe: str, window_ms: int, tombstone_ttl_s: int, settle_lease_ms: int) -> str:
    """A chunk's dedupe arguments in Redis' protocol (a lookup: a type's are the same each call)."""
    return bulk_strings((dedupe, str(int(window_ms)), str(int(tombstone_ttl_s)), str(int(settle_lease_ms))))


#: The key prefixes among admit.lua's chunk arguments, in Redis' protocol.
_PREFIXES_TEXT = bulk_strings((keys.LIMIT_PREFIX, keys.LANE_PREFIX))


@functools.lru_cache(maxsize=256)
def _shared_keys_text(lane: str, minute: int) -> str:
    """``shared_keys`` of a chunk of ``lane`` in ``minute``, in Redis' protocol: the same for every call of
    a lane in a minute, so this is mostly a lookup (packing its 21 keys was a tenth of a dispatch's CPU)."""
    return bulk_strings(shared_keys(Chunk("", minute * 60.0, lane, "", True, 0, 0, 0, 0)))


#: A kombu priority's text (0..9).
_DIGITS = tuple(str(digit) for digit in range(10))


@functools.lru_cache(maxsize=256)
def _ms(seconds: float) -> str:
    """``seconds`` in whole milliseconds, as text: a chunk's items share their deadline and due times
    (one ``now`` a chunk), so this is mostly a lookup."""
    return str(stored_ms(seconds))
