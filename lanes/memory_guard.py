"""Admission's memory guard: refuse new work before Redis reaches its ``maxmemory``.

With ``maxmemory`` and ``noeviction`` a full Redis refuses every write, a lease
renewal or a finish as much as a new task: a flood would end with accepted
tasks unable to finish. So admission refuses first, past ``DISPATCH_MEMORY_HIGH``
(a share of ``maxmemory``, 0.9 by default), and the rest stays for what accepted
tasks still write.

Cost on the dispatch path: no Redis command per task. Each process reads
``INFO memory`` once per ``DISPATCH_MEMORY_CHECK_S`` (1 s) and in between
adds what it admitted itself at the measured bytes per task
(``lanes.capacity``), reading again after each ``STEP_SHARE`` (1 %) of
``maxmemory`` it admitted by that estimate (a task larger than the estimate's
overshoots by that much at most); within ``NEAR_SHARE`` of the limit, every call
reads ``INFO`` (one command a dispatch, only near the limit).
Other processes' admissions are seen at the next read, so a flood from P
processes overshoots by at most P - 1 processes' second of dispatch: the
margin is sized for that. Without ``maxmemory`` (0) nothing is refused.
``DISPATCH_MEMORY_HIGH`` and ``DISPATCH_MEMORY_CHECK_S`` are read with each
``INFO`` (a change is seen at the next read, or at once after ``forget``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import redis
from django.conf import settings

from lanes import capacity
from lanes.redis_client import get_redis


@dataclass
class _Reading:
    at: float = float("-inf")  # monotonic time of the last INFO
    used: int = 0  # used_memory then, plus what this process admitted since
    read: int = 0  # used_memory then
    maxmemory: int = 0
    busy: bool = False  # a thread is reading INFO now
    #: ``DISPATCH_MEMORY_HIGH`` and ``DISPATCH_MEMORY_CHECK_S``, read with each INFO (None: not read yet).
    high: float | None = None
    check_s: float = 0.0


#: Within this share of ``maxmemory`` below the limit, every check reads ``INFO memory`` (one command a call).
NEAR_SHARE = 0.05
#: ``INFO memory`` is read again once this process admitted this share of ``maxmemory`` by its estimate.
STEP_SHARE = 0.01

_reading = _Reading()
_lock = threading.Lock()


def _refresh(now: float) -> None:
    """Read ``INFO memory`` unless another thread is reading it now; never holds the lock while Redis answers.

    A stalled Redis makes the read wait for its timeout: the other dispatching threads keep the reading
    they have instead of queueing behind it (each waiting its own timeout, one after another), and a
    failed read counts as a reading for ``DISPATCH_MEMORY_CHECK_S`` (the admission call that follows meets
    the same Redis and answers ``unavailable`` if it is away).
    """
    with _lock:
        if _reading.busy:
            return
        _reading.busy = True
    info = None
    # The settings are read with INFO, not per call: a read of django.conf.settings is Python code run
    # for every attribute (about 5K instructions each, two were a twentieth of a lone dispatch's CPU).
    high, check_s = settings.DISPATCH_MEMORY_HIGH, settings.DISPATCH_MEMORY_CHECK_S
    try:
        info = get_redis().info("memory")
    except redis.RedisError:
        pass
    finally:
        with _lock:
            _reading.busy = False
            _reading.at = max(_reading.at, now)
            _reading.high, _reading.check_s = high, check_s
            if info is not None:
                _reading.maxmemory = int(info.get("maxmemory", 0))
                _reading.used = _reading.read = int(info["used_memory"])


def _estimate(items: int, high: float) -> tuple[int | None, float]:
    """(the limit, or None for none; what Redis would hold with ``items`` more), from the reading (under the lock)."""
    limit = capacity.memory_limit(_reading.maxmemory, high)
    return limit, _reading.used + items * capacity.PATHS["plain"].bytes_waiting


def refusal(items: int = 1, now: float | None = None) -> str | None:
    """Why ``items`` more tasks must be refused now (the detail of ``redis_memory_high``), or None.

    A Redis error here admits (the admission call that follows meets the same
    Redis and answers ``unavailable`` if it is away).
    """
    now = time.monotonic() if now is None else now
    if now - _reading.at >= _reading.check_s or _reading.high is None:
        _refresh(now)
    if not _reading.maxmemory:  # no maxmemory (or none known yet): nothing to refuse, no lock to take
        return None
    with _lock:
        high = _reading.high
        if high is None:  # another thread is making the first read: nothing is known yet, so admit
            return None
        limit, estimate = _estimate(items, high)
        if limit is None:
            return None
        near = estimate >= limit - NEAR_SHARE * _reading.maxmemory
        again = (near or estimate - _reading.read >= STEP_SHARE * _reading.maxmemory) and _reading.at != now
    if again:
        # A task may be larger than the estimate's and other processes admit too: what Redis holds,
        # after each STEP_SHARE of maxmemory this process admitted, and near the limit each call.
        _refresh(now)
    with _lock:
        limit, estimate = _estimate(items, high)
        if limit is None:
            return None
        if estimate < limit:
            _reading.used = int(estimate)
            return None
        return (f"Redis memory is high: {_reading.used} bytes used of maxmemory {_reading.maxmemory} "
                f"(new work is refused past {high:.0%}, so that accepted tasks can still finish); retry later")


def forget() -> None:
    """Drop the cached reading (tests; a process that changed ``maxmemory``)."""
    with _lock:
        _reading.at, _reading.used, _reading.read, _reading.maxmemory = float("-inf"), 0, 0, 0
        _reading.high = None
