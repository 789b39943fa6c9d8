"""``dispatch_many``: many dispatches of one task type, one Redis round trip per chunk of items.

Each item is admitted or rejected on its own, exactly as ``dispatch.delay``
would (the same validation, the same admission steps, the same reasons), and
the results come back in input order. What changes is the cost: a chunk of
``CHUNK_ITEMS`` items is validated in the caller and admitted by one
admit_many.lua call (each item by ``admit_one``, the steps admit.lua runs for
one dispatch), the chunks pipelined on one connection, so a chunk pays one
round trip and one script call instead of one of each per item. The contract
is the same: accepted means stored; an item whose answer was lost with the
connection is ``unavailable`` with "outcome unknown", and a retry with the same
idempotency keys returns the stored tasks and never makes a second.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import Any

import redis
from celery import shared_task
from django.conf import settings

from lanes.lua import admit_many
from lanes.lua.admit import count_dispatched, reports_a_task
from lanes.lua.loader import NotSent
from tasks import config
from tasks.admission import (
    DISPATCH_OPTIONS,
    DispatchResult,
    Prepared,
    config_kept_changing,
    confirm_config,
    interpret,
    prepare,
    rejected_invalid,
    shared_settings,
    unavailable,
)
from tasks.validation import Invalid, shown

logger = logging.getLogger(__name__)

#: Items admitted in one Redis round trip: large enough that the round trip is
#: noise, small enough that one chunk's scripts keep Redis busy for only a few ms.
CHUNK_ITEMS = 500
#: Rounds a chunk makes when admit.lua answers 'stale' (an admin save landed mid-chunk).
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
                  metadata: dict | None = None, id_prefix: str = "") -> list[DispatchResult]:
    """Dispatch each of ``items`` as a task of ``task_type``; one ``DispatchResult`` per item, in order.

    An item is a payload (a JSON object), or a pair ``(payload, options)``
    whose options are ``dispatch.delay``'s keyword arguments (``chat_id``,
    ``priority``, ``idempotency_key``, ``timeout``, ``metadata``, ``limit_key``,
    ...). ``timeout`` and ``metadata`` here are every item's default; an item's
    own options win. Never raises for bad input: a bad item is a rejection with
    its reason, and the other items are admitted regardless.

    ``id_prefix`` starts every new task id (the HTTP API marks its caller's tasks so: ``api.tenancy``).

    Python's cyclic garbage collector is paused for the call (``collector_paused``).
    """
    with collector_paused():
        return _dispatch_many(task_type, items, timeout=timeout, metadata=metadata, id_prefix=id_prefix)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block, as ``timeit`` does, and restore it after.

    A bulk call makes tens of thousands of objects that live until it returns
    (an item's entry, options and result), and the collector's generation
    thresholds then walked the caller's whole heap for them about once per
    5,000 items: a fifth of the call's time (``gc.callbacks``, BENCHMARKS.md).
    Objects are still freed as their last reference goes; only the search for
    reference cycles waits for the end of the call.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _dispatch_many(task_type: str, items: Iterable[Any], *, timeout: float | None,
                   metadata: dict | None, id_prefix: str = "") -> list[DispatchResult]:
    entries = list(items)
    results: list[DispatchResult | None] = [None] * len(entries)
    try:
        snap = config.current()
    except redis.RedisError as exc:
        return [unavailable(exc, None) for _ in entries]
    defaults = {"timeout": timeout, "metadata": metadata}
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
    _Admission(task_type, snap, results).run(queue)
    return results  # type: ignore[return-value]  # _Admission.run fills every slot left


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


class _Admission:
    """The items of one ``dispatch_many`` call through admit_many.lua, a chunk per call.

    Up to ``IN_FLIGHT`` chunks are sent before the oldest one's replies are
    read, so the caller's work overlaps Redis'; one connection keeps the items
    in order. A chunk's replies become results as they are read; with
    ``DISPATCH_REPLICA_ACKS`` they wait in ``answered`` until that many
    replicas confirmed every write (one ``WAIT`` at the end).
    A 'stale' reply (an admin save landed mid-call) puts the items from there
    on back at the front of the queue, to be judged again by the new config.
    """

    def __init__(self, task_type: Any, snap: config.Snapshot, results: list[DispatchResult | None]) -> None:
        self.task_type, self.snap, self.results = task_type, snap, results
        self.answered: list[tuple[int, Prepared, Any, dict]] = []
        self.sent: deque[list[tuple[int, Prepared]]] = deque()
        self.entries: dict[int, tuple[int, Any, dict[str, Any], str]] = {}
        self.confirmed = False
        self.rounds = 0
        self.chunks = 0  # sent so far
        self.lost = 0  # items answered 'unavailable'
        self.settle_now = True

    def run(self, queue: deque[tuple[int, Any, dict[str, Any], str]]) -> None:
        self.entries = {entry[0]: entry for entry in queue}
        # Without replica acks a reply is final when it comes: each chunk's results are made while Redis
        # admits the next ones, not all at the end with Redis idle (a sixth of a large call's time).
        self.settle_now = settings.DISPATCH_REPLICA_ACKS <= 0
        with admit_many.stream() as stream:
            while queue or self.sent:
                if queue:
                    size = next_chunk_size(self.chunks, len(queue))
                    chunk = [queue.popleft() for _ in range(size)]
                    version = self.snap.version
                    prepared = self._prepare(chunk)
                    if self.snap.version != version and self.sent:
                        # Validation met a newer config: the chunks in flight went out under the old one. Those
                        # that come back stale must be admitted before this chunk, as they come before it.
                        stale = self._drain(stream)
                        if stale:
                            queue.extendleft(self.entries[index] for index, _ in reversed(prepared))
                            self._requeue(stale, queue)
                            continue
                    if prepared:
                        stream.send([admit_many.packed([p.script_args for _, p in prepared])])
                        self.sent.append(prepared)
                        self.chunks += 1
                # Chunks wait in Redis (up to IN_FLIGHT) while the next is prepared; past that, or at the end, read.
                if len(self.sent) >= IN_FLIGHT or (self.sent and not queue):
                    stale = self._receive(stream)
                    if stale:
                        self._requeue(stale + self._drain(stream), queue)
            failed = stream.replicas_confirmed(settings.DISPATCH_REPLICA_ACKS,
                                               settings.DISPATCH_REPLICA_ACKS_TIMEOUT_MS) \
                if not self.settle_now and any(
                    not isinstance(reply, redis.RedisError) and reports_a_task(reply)
                    for _, _, reply, _ in self.answered) else None
        self._settle(self.answered, failed)
        if self.lost:
            logger.warning("dispatch_many_unavailable type=%s items=%d", shown(self.task_type, 100), self.lost)

    def _settle(self, answered: list[tuple[int, Prepared, Any, dict]], failed: redis.RedisError | None) -> None:
        """Turn ``answered`` replies into results; ``failed``: the replicas did not confirm the writes."""
        dispatched: Counter[tuple[str, str, float]] = Counter()
        for index, item, reply, limits in answered:
            if failed is not None and not isinstance(reply, redis.RedisError) and reports_a_task(reply):
                reply = failed
            if isinstance(reply, redis.RedisError):
                if isinstance(reply, NotSent):
                    self.results[index] = unavailable(reply.cause, None)
                else:
                    self.results[index] = unavailable(reply, item.task_id)
                self.lost += 1
            else:
                if reply[0] == b"ok":
                    dispatched[item.tc.lane, item.tc.name, item.now] += 1
                self.results[index] = interpret(reply, reply[0].decode(), item, limits)
        for (lane, name, now), amount in dispatched.items():
            count_dispatched(lane, name, now, amount)  # in process (lanes.counters), once a chunk

    def _prepare(self, chunk: list[tuple[int, Any, dict[str, Any], str]]) -> list[tuple[int, Prepared]]:
        """Validate ``chunk`` against the config; rejections are final, the rest go to Redis."""
        prepared: list[tuple[int, Prepared]] = []
        invalid: list[tuple[int, Invalid]] = []
        now = time.time()  # one for the chunk, as admit_many.lua admits it at one time
        shared = shared_settings()
        for index, payload, options, task_id in chunk:
            try:
                prepared.append((index, prepare(self.snap, self.task_type, payload, task_id=task_id, now=now,
                                                shared=shared, **options)))
            except Invalid as exc:
                invalid.append((index, exc))
        if invalid and not self.confirmed:
            # As in admit: a rejection may come from a cached config older than a fresh admin save.
            self.confirmed = True
            fresh = confirm_config(self.snap)
            if fresh.version != self.snap.version:
                self.snap = fresh
                return self._prepare(chunk)
        for index, error in invalid:
            self.results[index] = rejected_invalid(self.snap, self.task_type, error)
        return prepared

    def _receive(self, stream: Any) -> list[tuple[int, str]]:
        """Read the oldest chunk's replies; returns its 'stale' items (index, Redis' config version)."""
        batch = self.sent.popleft()
        stale: list[tuple[int, str]] = []
        (reply,) = stream.receive()
        if isinstance(reply, redis.RedisError):
            item_replies = [reply] * len(batch)
        else:
            try:
                item_replies = admit_many.replies(reply, len(batch))
            except ValueError as exc:  # never expected: a script that answered out of shape stored unknown items
                item_replies = [redis.ResponseError(str(exc))] * len(batch)
        answered = self.answered if not self.settle_now else []
        for (index, item), reply in zip(batch, item_replies, strict=True):
            if not isinstance(reply, redis.RedisError) and reply[0] == b"stale":
                stale.append((index, reply[1].decode()))
            else:
                answered.append((index, item, reply, self.snap.limits))
        if self.settle_now:
            self._settle(answered, None)
        return stale

    def _drain(self, stream: Any) -> list[tuple[int, str]]:
        """Read every chunk in flight; returns their stale items, in order (once one is stale, all after it are:
        Redis' config version only moves forward)."""
        stale: list[tuple[int, str]] = []
        while self.sent:
            stale += self._receive(stream)
        return stale

    def _requeue(self, stale: list[tuple[int, str]], queue: deque) -> None:
        """Put the stale items back at the front of ``queue``, in order, under the config Redis has now."""
        self.rounds += 1
        if self.rounds >= MAX_ROUNDS:
            for index, _ in stale:
                self.results[index] = config_kept_changing()
            return
        try:
            self.snap = config.ensure(stale[-1][1])
        except redis.RedisError as exc:  # nothing of these was written: admit.lua stopped at the version
            for index, _ in stale:
                self.results[index] = unavailable(exc, None)
            return
        queue.extendleft(self.entries[index] for index, _ in reversed(stale))


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
