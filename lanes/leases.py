"""Running tasks' leases: kept fresh while they run, and finished records settled.

One daemon thread per process renews every running task's lease in one
pipelined call each ``lease/3`` seconds; a task whose process dies stops being
renewed, and the recovery sweep republishes it once the lease runs out.

The same thread settles finished tasks: ``finish.lua`` leaves the record under
a short lease until the result row is stored (the broker keeps no copy of a
platform message once delivered: ``lanes.transport``); the worker then queues
it here, and every ``SETTLE_EVERY_S`` one ``forget.lua`` call removes all that
were queued. Batched, settling costs a fraction of a Redis round trip per task
instead of kombu's two (record as unacked, then ack).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from django.conf import settings

from lanes import keys
from lanes.forksafe import ForkSafeLock
from lanes.lua.forget import forget
from lanes.redis_client import get_redis

logger = logging.getLogger(__name__)
HOST = socket.gethostname()
#: Seconds between settling calls (while any finished task waits to be settled).
SETTLE_EVERY_S = 0.1
#: Most records one settling call removes; the rest wait for the next call.
SETTLE_BATCH = 500
#: Most records waiting to be settled; past this the oldest are left to the
#: sweep (Redis unreachable for long): their copies re-store the result and settle.
SETTLE_BACKLOG_MAX = 20000

_lock = ForkSafeLock()
_running: dict[str, int] = {}
_settling: list[str] = []
_thread: threading.Thread | None = None
_thread_pid: int | None = None


def owner_id() -> str:
    return f"{HOST}:{os.getpid()}:{threading.get_ident()}"


def owner_is_dead_here(owner: str) -> bool:
    """True when ``owner`` ran on this host in a process that no longer exists."""
    try:
        host, pid, _thread_id = owner.rsplit(":", 2)
        pid_n = int(pid)
    except ValueError:
        return False
    if host != HOST or pid_n == os.getpid():
        return False
    try:
        os.kill(pid_n, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def hold(record: str) -> None:
    with _lock:
        _running[record] = _running.get(record, 0) + 1
    _ensure_thread()


def release(record: str) -> None:
    with _lock:
        left = _running.get(record, 0) - 1
        if left > 0:
            _running[record] = left
        else:
            _running.pop(record, None)


def settle(record: str) -> None:
    """Queue a finished task's record for removal: its result row is stored."""
    with _lock:
        _settling.append(record)
        if len(_settling) > SETTLE_BACKLOG_MAX:
            del _settling[: len(_settling) - SETTLE_BACKLOG_MAX]
    _ensure_thread()


def settle_now() -> None:
    """Remove every queued finished record now, one call per batch."""
    while True:
        with _lock:
            batch = _settling[:SETTLE_BATCH]
            del _settling[:SETTLE_BATCH]
        if not batch:
            return
        try:
            forget(batch)
        except Exception:
            with _lock:
                _settling[:0] = batch  # Redis away: keep them for the next call
            logger.warning("settle_failed records=%d", len(batch), exc_info=True)
            return


def _ensure_thread() -> None:
    global _thread, _thread_pid
    if _thread is not None and _thread_pid == os.getpid() and _thread.is_alive():
        return
    with _lock:
        if _thread is not None and _thread_pid == os.getpid() and _thread.is_alive():
            return
        _thread_pid = os.getpid()
        _thread = threading.Thread(target=_tend_forever, name="dispatch-lease", daemon=True)
        _thread.start()


def _tend_forever() -> None:
    lease_s = settings.DISPATCH_LEASE_S
    renew_every = max(0.2, lease_s / 3)
    next_renewal = time.monotonic() + renew_every
    while True:
        time.sleep(SETTLE_EVERY_S)
        if _settling:
            settle_now()
        if time.monotonic() >= next_renewal:
            next_renewal = time.monotonic() + renew_every
            _renew(lease_s)


def _renew(lease_s: float) -> None:
    with _lock:
        records = list(_running)
    if not records:
        return
    until = int((time.time() + lease_s) * 1000)
    try:
        get_redis().zadd(keys.LEASES, {record: until for record in records}, xx=True)
    except Exception:
        logger.warning("lease_renew_failed records=%d", len(records), exc_info=True)


def _after_fork_in_child() -> None:
    # The parent's renewal thread does not exist in the child: start clean.
    global _thread, _thread_pid
    _running.clear()
    _settling.clear()
    _thread = None
    _thread_pid = None


os.register_at_fork(after_in_child=_after_fork_in_child)
