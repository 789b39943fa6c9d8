"""Metric counters of the hot path, kept in process and written to Redis in batches.

Why (the Redis budget, docs/redis-budget.md): each task's own counts (dispatched, started, succeeded
or dead, completed per lane, the latency histograms and their sums, the lane's
handler seconds) cost 17 Redis commands a task when the scripts wrote them
(a ``HINCRBY`` per field into the all-time hash and the minute's hash). Here
they add up in memory, per minute and field, and one pipelined call writes each
field's sum every ``FLUSH_EVERY_S`` (a daemon thread per process; also at
exit and when a pool child stops): Redis then runs one command per *field* per
second instead of two per *task*. The layout (``keys.METRICS_TOTAL``,
``keys.metrics_minute``, fields ``kind|lane|type[|extra]``) is the one the
readers (``ops.metrics``) always read.

What it costs:

- A reader in another process sees a count up to ``FLUSH_EVERY_S`` late
  (the dashboard, ``/metrics``, ``manage.py lanes``). A reader in this process
  calls ``flush()`` first and sees every count.
- A process killed with SIGKILL (or a Redis unreachable for longer than
  ``PENDING_MAX`` distinct fields' worth) loses the counts of its last second
  at most; nothing else: counters are statistics, never a task's state.
- Admission's estimate reads the lane's completions and handler seconds of
  this minute and the previous one: at most a second behind.
- A call whose reply was lost and that is sent again (``finish``: 'already')
  is counted by neither run.

Counts that are rare or that a script must make atomically with its decision
(rejections, retries, limits admitted/throttled, expiries) stay in the scripts.
"""

from __future__ import annotations

import atexit
import logging
import os

from redis.exceptions import ConnectionError as RedisConnectionError

from lanes import keys
from lanes.flusher import Flusher
from lanes.forksafe import ForkSafeLock

logger = logging.getLogger(__name__)

#: Seconds between two writes of the pending counts.
FLUSH_EVERY_S = 1.0
#: Seconds a minute hash is kept (``lanes.metrics.MINUTE_TTL_S``; the scripts use the same).
MINUTE_TTL_S = 1200
#: Most distinct (minute, field) entries kept while Redis does not take them; more are dropped.
PENDING_MAX = 50_000

#: Where an amount goes: both hashes, the all-time hash only, the minute's hash only.
BOTH, TOTAL, MINUTE = "both", "total", "minute"

_lock = ForkSafeLock()
#: (minute, field, where) -> amount waiting to be written.
_pending: dict[tuple[int, str, str], float] = {}
#: Minutes whose hash this process has given its expiry: one EXPIRE a minute hash and process, not a flush.
_expiring: set[int] = set()


def add(field: str, now: float, amount: float = 1, where: str = BOTH) -> None:
    """Count ``amount`` under ``field`` at ``now`` (epoch seconds); written within ``FLUSH_EVERY_S``."""
    entry = (int(now // 60), field, where)
    with _lock:
        if entry not in _pending and len(_pending) >= PENDING_MAX:
            return
        _pending[entry] = _pending.get(entry, 0) + amount
    _flusher.ensure()


def observe(name: str, suffix: str, bucket: str, seconds: float, now: float) -> None:
    """A latency observation: its bucket's count and the running sum (``_lib.lua``'s ``observe``, in process)."""
    if not bucket:
        return
    add(f"{name}|{suffix}|{bucket}", now)
    add(f"{name}_sum|{suffix}", now, seconds, TOTAL)


def pending() -> int:
    """Entries waiting to be written (for tests and the worker's shutdown)."""
    with _lock:
        return len(_pending)


def flush(client=None) -> int:
    """Write every pending count in one pipelined call; returns how many entries were written.

    On failure the counts are kept for the next call (nothing is counted twice:
    a pipeline that raised may have run in part only if the connection dropped
    mid-way, and then its entries are written again: a rare over-count, never
    a lost task).
    """
    with _lock:
        batch = dict(_pending)
        _pending.clear()
    if not batch:
        return 0
    if client is None:
        from lanes.redis_client import get_redis  # inner import: keeps this module light for the transport

        client = get_redis()
    pipe = client.pipeline(transaction=False)
    minutes = set()
    for (minute, field, where), amount in batch.items():
        whole = float(amount).is_integer()
        targets = {BOTH: (keys.METRICS_TOTAL, keys.metrics_minute(minute)), TOTAL: (keys.METRICS_TOTAL,),
                   MINUTE: (keys.metrics_minute(minute),)}[where]
        for key in targets:
            if whole:
                pipe.hincrby(key, field, int(amount))
            else:
                pipe.hincrbyfloat(key, field, amount)
        if where != TOTAL:
            minutes.add(minute)
    minutes -= _expiring
    for minute in minutes:
        pipe.expire(keys.metrics_minute(minute), MINUTE_TTL_S)
    try:
        pipe.execute()
    except Exception as error:
        with _lock:
            for entry, amount in batch.items():
                if entry in _pending or len(_pending) < PENDING_MAX:
                    _pending[entry] = _pending.get(entry, 0) + amount
        # Redis out of reach (stopped, restarting) says all in one line; anything else keeps its traceback.
        logger.warning("counters_flush_failed entries=%d error=%s", len(batch), error,
                       exc_info=not isinstance(error, RedisConnectionError))
        return 0
    if minutes:
        # The minute's hash exists with its expiry from here on (it lives 20 minutes; a process's later
        # writes into it need no EXPIRE). Older minutes are forgotten: a flush writes this minute or the last.
        _expiring.update(minutes)
        newest = max(_expiring)
        _expiring.difference_update({m for m in _expiring if m < newest - 1})
    return len(batch)


_flusher = Flusher("counters", FLUSH_EVERY_S, flush, lambda: bool(_pending))
#: ``flush()`` for exit hooks and signal receivers: never raises.
flush_quietly = _flusher.flush_quietly


def _after_fork_in_child() -> None:
    # The parent's counts are the parent's to write (its thread does not exist here: the flusher starts one).
    _pending.clear()
    _expiring.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(flush_quietly)
