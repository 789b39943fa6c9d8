"""Admission's one path (``Admission``): ``dispatch.delay`` is a chunk of one, ``dispatch_many`` chunks of many.

``dispatch_many`` admits many dispatches of one task type, one Redis round
trip per chunk of items. Each item is admitted or rejected on its own, exactly
as ``dispatch.delay`` would (the same validation, the same admission steps,
the same reasons), and the results come back in input order. What changes is
the cost: a chunk of up to ``CHUNK_ITEMS`` items is validated in the caller
and admitted by one admit.lua call (each item by ``admit_one``, _admit.lua),
the chunks pipelined on one connection, so a chunk pays one round trip and one
script call instead of one of each per item. The contract is the same:
accepted means stored; an item whose answer was lost with the connection is
``unavailable`` with "outcome unknown", and a retry with the same idempotency
keys returns the stored tasks and never makes a second.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from celery import shared_task

from lanes import memory_guard
from lanes.forksafe import ForkSafeLock
from lanes.latch import Latch
from lanes.lua import admit
from lanes.lua.loader import NotSent
from lanes.redis_client import deadline
from tasks import config, owners, tracing
from tasks.admission import (
    DISPATCH_OPTIONS,
    DispatchResult,
    Prepared,
    chunk_context,
    config_kept_changing,
    confirm_config,
    dispatch_settings,
    interpret,
    memory_high,
    prepare,
    rejected_invalid,
    script_chunk,
    unavailable,
)
from tasks.validation import Invalid, shown

logger = logging.getLogger(__name__)

#: Items admitted in one Redis round trip: large enough that the round trip is
#: noise, small enough that one chunk's scripts keep Redis busy for only a few ms.
CHUNK_ITEMS = 500
#: Rounds a chunk makes when admit.lua answers ``Stale`` (an admin save landed mid-chunk).
MAX_ROUNDS = 4
#: Chunks sent and not answered yet, at most: Redis has the next ones while the caller prepares
#: another, through the jitter of either side.
IN_FLIGHT = 3
#: The first chunk's items, doubled each chunk up to ``CHUNK_ITEMS``; the last chunks halve down to it.
#: Redis starts on a small chunk at once and ends on one, instead of waiting while the caller prepares
#: a whole first chunk, and the caller waiting while Redis admits a whole last one.
EDGE_CHUNK_ITEMS = 50


def next_chunk_size(sent: int, remaining: int) -> int:
    """The items of the next chunk, after ``sent`` chunks, with ``remaining`` items left (at least one)."""
    if remaining <= EDGE_CHUNK_ITEMS and remaining <= CHUNK_ITEMS:  # what the bounds below come to then
        return max(1, remaining)
    ramp = EDGE_CHUNK_ITEMS << min(sent, 20)
    taper = max(EDGE_CHUNK_ITEMS, remaining // 2)
    return max(1, min(CHUNK_ITEMS, ramp, taper, remaining))


def chunk_sizes(total: int) -> list[int]:
    """The chunks ``total`` items are sent in (none stale): ``next_chunk_size`` all the way."""
    sizes: list[int] = []
    while total > 0:
        sizes.append(next_chunk_size(len(sizes), total))
        total -= sizes[-1]
    return sizes


def dispatch_many(task_type: str, items: Iterable[Any], *, timeout: float | None = None,
                  metadata: dict | None = None, id_prefix: str = "",
                  lane_share: int = owners.WHOLE_LANE_PCT) -> list[DispatchResult]:
    """Dispatch each of ``items`` as a task of ``task_type``; one ``DispatchResult`` per item, in order.

    An item is a payload (a JSON object), or a pair ``(payload, options)``
    whose options are ``dispatch.delay``'s keyword arguments (``chat_id``,
    ``priority``, ``idempotency_key``, ``timeout``, ``metadata``, ``limit_key``,
    ...). ``timeout`` and ``metadata`` here are every item's default; an item's
    own options win. Never raises for bad input: a bad item is a rejection with
    its reason, and the other items are admitted regardless.

    ``id_prefix`` starts every new task id (the HTTP API marks its caller's tasks so: ``api.tenancy``);
    ``lane_share``: the percentage of the lane's capacity the caller's tasks may hold (``caller_quota``).
    """
    entries = list(items)
    results: list[DispatchResult | None] = [None] * len(entries)
    try:
        snap = config.current()
    except redis.RedisError as exc:
        return [unavailable(exc, None) for _ in entries]
    with tracing.dispatching(task_type, len(entries)) as traced:
        defaults = traced.carry({"timeout": timeout, "metadata": metadata})
        _admit_items(task_type, snap, entries, defaults, id_prefix, results, lane_share)
        traced.answered(results)
    return results  # type: ignore[return-value]  # Admission.run fills every slot left


def _admit_items(task_type: str, snap: config.Snapshot, entries: list[Any], defaults: dict[str, Any],
                 id_prefix: str, results: list[DispatchResult | None], lane_share: int) -> None:
    queue: deque[tuple[int, Any, dict[str, Any], str]] = deque()
    task_ids = new_task_ids(len(entries))
    if id_prefix:
        task_ids = [id_prefix + task_id for task_id in task_ids]
    for (index, item), task_id in zip(enumerate(entries), task_ids, strict=True):
        try:
            payload, options = split_item(item, defaults)
        except Invalid as exc:
            results[index] = rejected_invalid(snap, task_type, exc)
            continue
        queue.append((index, payload, options, task_id))
    Admission(task_type, snap, results, lane_share=lane_share).run(queue)


def admit_one(task_type: Any, payload: Any, options: dict[str, Any], *, task_id: str,
              replace_idempotency: bool = False, lane_share: int = owners.WHOLE_LANE_PCT) -> DispatchResult:
    """One dispatch (``dispatch.delay``): a chunk of one through ``Admission``, as ``dispatch_many``'s chunks go.

    Calls made from other threads of this process while one is in Redis wait for it and then go
    together, a chunk per task type in one round trip (``Joiner``): eight threads dispatching at once
    pay about one round trip for each turn, not eight. A call on an idle process goes at once.
    """
    bound = dispatch_settings().redis_timeout_s
    with tracing.dispatching(task_type, 1) as traced, deadline(bound):  # a turn may run in another's thread
        waiting = Waiting(task_type, payload, traced.carry(options), task_id, replace_idempotency, lane_share)
        waiting.until = time.monotonic() + bound
        result = _JOINER.admit(waiting)
        traced.answered([result])
    return result


def _admit_now(entries: list[Waiting]) -> None:
    """Admit ``entries`` (each gets its ``result``): one ``Admission`` per task type, in their order."""
    try:
        snap = config.current()
    except redis.RedisError as exc:
        for entry in entries:
            entry.result = unavailable(exc, None)
        return
    for group in _by_kind(entries):
        results: list[DispatchResult | None] = [None] * len(group)
        first = group[0]
        queue = (deque(((0, first.payload, first.options, first.task_id),)) if len(group) == 1 else  # no generator
                 deque((i, e.payload, e.options, e.task_id) for i, e in enumerate(group)))
        Admission(first.task_type, snap, results, replace_idempotency=first.replace,
                  lane_share=first.share).run(queue)
        for entry, result in zip(group, results, strict=True):
            entry.result = result


def _by_kind(entries: list[Waiting]) -> Iterable[list[Waiting]]:
    """``entries`` by what one ``Admission`` shares (task type, requeue, caller's share), in order of first call."""
    if len(entries) == 1:
        return (entries,)
    by_kind: dict[tuple[Any, bool, int], list[Waiting]] = {}
    for entry in entries:
        key = (entry.task_type if isinstance(entry.task_type, str) else id(entry.task_type), entry.replace,
               entry.share)
        by_kind.setdefault(key, []).append(entry)
    return by_kind.values()


def answer(reply: admit.Reply | redis.RedisError, item: Prepared, limits: dict[str, dict] | None,
           lane_share: int) -> DispatchResult:
    """The result of one item's final admit.lua reply (not ``Stale``), or of the error its call met."""
    if isinstance(reply, NotSent):  # nothing written: no task id to look for
        return unavailable(reply.cause, None)
    if isinstance(reply, redis.RedisError):
        return unavailable(reply, item.task_id)
    return interpret(reply, item, limits, lane_share)


class Waiting:
    """One ``dispatch.delay`` call on its way through the ``Joiner``."""

    __slots__ = ("options", "payload", "replace", "result", "share", "task_id", "task_type", "turn", "until")

    def __init__(self, task_type: Any, payload: Any, options: dict[str, Any], task_id: str,
                 replace: bool, share: int = owners.WHOLE_LANE_PCT) -> None:
        self.task_type, self.payload, self.options, self.task_id = task_type, payload, options, task_id
        self.replace, self.share = replace, share
        self.result: DispatchResult | None = None
        self.turn: Latch | None = None  # set when its result is in, or when it leads the next turn
        self.until = float("inf")  # monotonic time by which its caller has an answer, whoever's turn it is in


#: Seconds a call waits for the one in Redis before it goes alone: far above a turn's time when Redis
#: answers (milliseconds), far below a stalled Redis's timeout (``DISPATCH_REDIS_TIMEOUT_S``).
JOIN_WAIT_S = 0.5


class Joiner:
    """Concurrent single dispatches of one process share round trips (group commit, in the caller).

    One call at a time is in Redis: its caller *leads*. Calls made meanwhile wait in ``waiting``;
    when the leader's call returns, the first of them leads the next turn, which admits every call
    waiting by then at once. No call waits for more than the call in Redis and its own turn, nor
    more than ``JOIN_WAIT_S`` for a slow one: then it goes alone. A call taken into a turn that is
    slow answers ``unavailable`` (outcome unknown) at its own deadline (``admit_one``'s).
    """

    def __init__(self) -> None:
        self._lock = ForkSafeLock()
        self._busy = False
        self._waiting: list[Waiting] = []

    def admit(self, entry: Waiting) -> DispatchResult:
        with self._lock:
            lead = not self._busy
            if lead:
                self._busy = True
            else:
                entry.turn = Latch()
                self._waiting.append(entry)
        if not lead:
            assert entry.turn is not None
            if not entry.turn.wait(JOIN_WAIT_S) and self._leave(entry):
                # The call in Redis is slow (Redis stalled, a timeout coming): this one goes alone, so
                # that no call waits for more than its own Redis calls and this bound.
                _admit_now([entry])
                assert entry.result is not None
                return entry.result
            if not entry.turn.wait(max(0.0, entry.until - time.monotonic())) and entry.result is None:
                # Its turn is in Redis under another call's deadline: answer on this call's own clock.
                return unavailable(redis.TimeoutError("the call in Redis for it did not answer in time"),
                                   entry.task_id)
            if entry.result is not None:
                return entry.result
            turn, entry.turn = self._take_turn(entry), None
        else:
            turn = [entry]
        self._run(turn)
        self._hand_on()
        assert entry.result is not None
        return entry.result

    def _leave(self, entry: Waiting) -> bool:
        """Take ``entry`` out of the waiting calls; False if a turn already took it (its answer is coming)."""
        with self._lock:
            if entry in self._waiting and not entry.turn.is_set():  # type: ignore[union-attr]
                self._waiting.remove(entry)
                return True
            return False

    def _take_turn(self, leader: Waiting) -> list[Waiting]:
        with self._lock:
            turn, self._waiting = self._waiting, []
        return [leader, *(e for e in turn if e is not leader)]

    @staticmethod
    def _run(turn: list[Waiting]) -> None:
        try:
            _admit_now(turn)
        finally:
            for entry in turn:
                if entry.result is None:  # never expected: Admission fills every result
                    entry.result = DispatchResult(False, reason="unavailable", detail="dispatch failed in the caller")
            for entry in turn[1:]:
                assert entry.turn is not None
                entry.turn.set()

    def _hand_on(self) -> None:
        """The next waiting call leads (it takes everyone waiting); none waiting: idle again."""
        with self._lock:
            if not self._waiting:
                self._busy = False
                return
            nxt = self._waiting[0]  # it takes itself and the rest in _take_turn
            assert nxt.turn is not None
            nxt.turn.set()  # under the lock: a call leaving (_leave) sees it chosen, and stays to lead


_JOINER = Joiner()


#: A version 4 UUID's variant digit (``10xx`` in its top bits) for each hex digit of random bits.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def new_task_ids(count: int) -> list[str]:
    """``count`` random ids, each as ``str(uuid.uuid4())`` writes one, from one ``os.urandom`` read:
    half the cost of ``uuid4`` an id (``tests/unit/test_bulk_pure.py`` holds them valid version 4 UUIDs)."""
    digits = os.urandom(16 * count).hex()
    return [f"{digits[i:i + 8]}-{digits[i + 8:i + 12]}-4{digits[i + 13:i + 16]}-"
            f"{_VARIANT[digits[i + 16]]}{digits[i + 17:i + 20]}-{digits[i + 20:i + 32]}"
            for i in range(0, 32 * count, 32)]


def split_item(item: Any, defaults: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``(payload, options)`` of one item, the call's defaults under its own; ``Invalid`` if its shape is wrong.

    A pair is a tuple or list of two (a JSON list is never a payload, so
    ``[payload, options]`` read from JSON means the same); anything else is
    the payload itself, which validation then judges.
    """
    if not isinstance(item, (tuple, list)):
        return item, defaults  # shared by every bare payload: options are only read (``prepare(**options)``)
    if len(item) != 2:
        raise Invalid("invalid_payload", f"an item is a payload or a (payload, options) pair, not a sequence of "
                                         f"{len(item)}")
    payload, options = item
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise Invalid("invalid_payload", f"an item's options must be a dict of dispatch options, not "
                                         f"{type(options).__name__}")
    unknown = sorted(shown(name, 40) for name in options if not isinstance(name, str) or name not in DISPATCH_OPTIONS)
    if unknown:
        raise Invalid("invalid_payload", f"unknown dispatch options: {', '.join(unknown)} "
                                         f"(known: {', '.join(sorted(DISPATCH_OPTIONS))})")
    merged = dict(defaults)
    merged.update(options)
    return payload, merged


#: One dispatch waiting in an ``Admission``'s queue: its index in the results, payload, options and task id.
Entry = tuple[int, Any, dict[str, Any], str]


class Admission:
    """Dispatches of one task type through admit.lua, a chunk per call: the one path of every dispatch.

    ``dispatch.delay`` is a chunk of one; ``dispatch_many`` sends chunks of up
    to ``CHUNK_ITEMS``, up to ``IN_FLIGHT`` of them before the oldest one's
    replies are read, so the caller's work overlaps Redis'; one connection
    (``admit.Calls``) keeps the items in order. A chunk's replies become results
    as they are read; with ``DISPATCH_REPLICA_ACKS`` they wait in ``answered``
    until that many replicas confirmed every write (one ``WAIT`` at the end). A
    ``Stale`` reply (an admin save landed mid-call) puts the chunk's items and
    those after it back at the front of the queue, to be judged again by the new
    config (the one retry loop: ``_requeue``); a rejection by validation is
    judged again once against the config Redis has.
    """

    __slots__ = ("answered", "confirmed", "lane_share", "lost", "replace_idempotency", "results", "rounds", "sent",
                 "settle_now", "snap", "task_type")

    def __init__(self, task_type: Any, snap: config.Snapshot, results: list[DispatchResult | None], *,
                 replace_idempotency: bool = False, lane_share: int = owners.WHOLE_LANE_PCT) -> None:
        self.task_type, self.snap, self.results = task_type, snap, results
        self.replace_idempotency, self.lane_share = replace_idempotency, lane_share
        #: Chunks sent and not read yet, oldest first: each item's queue entry and what was sent for it.
        self.sent: deque[list[tuple[Entry, Prepared]]] = deque()
        #: With replica acks: each chunk read (its items, replies, the limits they were judged by), until the WAIT.
        self.answered: list[tuple[list[tuple[Entry, Prepared]], Sequence[admit.Reply | redis.RedisError], dict]] = []
        self.settle_now = True
        self.confirmed = False
        self.rounds = 0
        self.lost = 0  # items answered 'unavailable'

    def run(self, queue: deque[Entry]) -> None:
        # Without replica acks a reply is final when it comes: each chunk's results are made while Redis
        # admits the next ones, not all at the end with Redis idle (a sixth of a large call's time).
        read = dispatch_settings()
        acks = read.replica_acks
        self.settle_now = acks <= 0
        sent = self.sent
        chunks = 0
        with admit.Calls() as calls:
            while queue or sent:
                if queue:
                    size = next_chunk_size(chunks, len(queue))
                    if size == len(queue):  # the rest in one chunk (a dispatch.delay's one item, the last chunk)
                        chunk = list(queue)
                        queue.clear()
                    else:
                        chunk = [queue.popleft() for _ in range(size)]
                    full = memory_guard.refusal(size)
                    if full:  # Redis near its maxmemory: the chunk is refused before its script runs
                        for index, *_ in chunk:
                            self.results[index] = memory_high(self.snap, self.task_type, full)
                        continue
                    version = self.snap.version
                    script_chunk, prepared = self._prepare(chunk)
                    if self.snap.version != version and sent:
                        # Validation met a newer config: the chunks in flight went out under the old one. Those
                        # that come back stale must be admitted before this chunk, as they come before it.
                        stale = self._drain(calls)
                        if stale:
                            queue.extendleft(entry for entry, _ in reversed(prepared))
                            self._requeue(stale, queue)
                            continue
                    if prepared:
                        items = [prepared[0][1].item] if len(prepared) == 1 else [p.item for _, p in prepared]
                        calls.send(script_chunk, items)  # type: ignore[arg-type]
                        sent.append(prepared)
                        chunks += 1
                # Chunks wait in Redis (up to IN_FLIGHT) while the next is prepared; past that, or at the end, read.
                if len(sent) >= IN_FLIGHT or (sent and not queue):
                    stale = self._receive(calls)
                    if stale:
                        self._requeue(stale + self._drain(calls), queue)
            failed = None
            if self.answered and any(admit.reports_a_task(reply) for _, replies, _ in self.answered
                                     for reply in replies):
                failed = calls.replicas_confirmed(acks, read.replica_acks_timeout_ms)
        for batch, replies, limits in self.answered:
            self._settle(batch, replies, limits, failed)
        if self.lost:
            logger.warning("dispatch_unavailable type=%s items=%d", shown(self.task_type, 100), self.lost)

    def _settle(self, batch: list[tuple[Entry, Prepared]], replies: Sequence[admit.Reply | redis.RedisError],
                limits: dict[str, dict], failed: redis.RedisError | None) -> None:
        """Turn a chunk's replies into results; ``failed``: the replicas did not confirm the writes."""
        results, share = self.results, self.lane_share
        admitted = 0
        for (entry, item), reply in zip(batch, replies, strict=True):
            if failed is not None and admit.reports_a_task(reply):
                reply = failed
            if isinstance(reply, admit.Admitted):
                admitted += 1
            elif isinstance(reply, redis.RedisError):
                self.lost += 1
            results[entry[0]] = answer(reply, item, limits, share)
        if admitted:  # a chunk is one type's, prepared at one time: counted once (in process, lanes.counters)
            item = batch[0][1]
            admit.count_dispatched(item.tc.lane, item.tc.name, item.now, admitted)

    def _prepare(self, chunk: list[Entry]) -> tuple[admit.Chunk | None, list[tuple[Entry, Prepared]]]:
        """Validate ``chunk`` against the config; rejections are final, the rest go to Redis (as one
        admit.lua chunk, returned with them: None when none is left)."""
        prepared: list[tuple[Entry, Prepared]] = []
        invalid: list[tuple[int, Invalid]] = []
        context = chunk_context()  # one for the chunk, as admit.lua admits it at one time
        snap, task_type = self.snap, self.task_type
        for entry in chunk:
            try:
                prepared.append((entry, prepare(snap, task_type, entry[1], task_id=entry[3], context=context,
                                                **entry[2])))
            except Invalid as exc:
                invalid.append((entry[0], exc))
        if invalid:
            if not self.confirmed:
                # A rejection may come from a cached config older than a fresh admin save.
                self.confirmed = True
                fresh = confirm_config(snap)
                if fresh.version != snap.version:
                    self.snap = fresh
                    return self._prepare(chunk)
            for index, error in invalid:
                self.results[index] = rejected_invalid(snap, task_type, error)
        if not prepared:
            return None, prepared
        return script_chunk(snap, prepared[0][1].tc, context, self.replace_idempotency, self.lane_share), prepared

    def _receive(self, calls: admit.Calls) -> list[tuple[Entry, str]]:
        """Read the oldest chunk's replies; returns its items if they came back stale (entry, Redis' config
        version): a call's are all stale or none (admit.lua checks the version before any item)."""
        batch = self.sent.popleft()
        replies = calls.receive()
        first = replies[0]
        if isinstance(first, admit.Stale):
            return [(entry, first.version) for entry, _ in batch]
        if self.settle_now:
            self._settle(batch, replies, self.snap.limits, None)
        else:
            self.answered.append((batch, replies, self.snap.limits))
        return []

    def _drain(self, calls: admit.Calls) -> list[tuple[Entry, str]]:
        """Read every chunk in flight; returns their stale items, in order (once one is stale, all after it are:
        Redis' config version only moves forward)."""
        stale: list[tuple[Entry, str]] = []
        while self.sent:
            stale += self._receive(calls)
        return stale

    def _requeue(self, stale: list[tuple[Entry, str]], queue: deque[Entry]) -> None:
        """Put the stale items back at the front of ``queue``, in order, under the config Redis has now."""
        self.rounds += 1
        if self.rounds >= MAX_ROUNDS:
            for (index, *_), _ in stale:
                self.results[index] = config_kept_changing()
            return
        try:
            self.snap = config.ensure(stale[-1][1])
        except redis.RedisError as exc:  # nothing of these was written: admit.lua stopped at the version
            for (index, *_), _ in stale:
                self.results[index] = unavailable(exc, None)
            return
        queue.extendleft(entry for entry, _ in reversed(stale))


@shared_task(name="tasks.dispatch_many", typing=False)
def dispatch_many_by_name(task_type: Any = None, items: Any = None, **options: Any) -> list[dict[str, Any]]:
    """Run by an ``ingress`` worker for callers that send ``tasks.dispatch_many`` by name: one dict per item."""
    if not isinstance(items, list):
        detail = f"items must be a list of payloads or [payload, options] pairs, not {type(items).__name__}"
        return [DispatchResult(False, reason="invalid_payload", detail=detail).as_dict()]
    unknown = sorted(set(options) - {"timeout", "metadata"})
    if unknown:
        detail = f"unknown dispatch_many options: {unknown} (known: metadata, timeout)"
        return [DispatchResult(False, reason="invalid_payload", detail=detail).as_dict() for _ in items]
    return [result.as_dict() for result in dispatch_many(task_type, items, **options)]
