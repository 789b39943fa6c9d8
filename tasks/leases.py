"""Keeps the leases of running tasks fresh while their handlers run.

One daemon thread per process renews every running task's lease in one
pipelined call each ``lease/3`` seconds; a task whose process dies stops being
renewed, and the recovery sweep republishes it once the lease runs out.
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
from lanes.redis_client import get_redis

logger = logging.getLogger(__name__)
HOST = socket.gethostname()

_lock = ForkSafeLock()
_running: dict[str, int] = {}
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


def _ensure_thread() -> None:
    global _thread, _thread_pid
    if _thread is not None and _thread_pid == os.getpid() and _thread.is_alive():
        return
    with _lock:
        if _thread is not None and _thread_pid == os.getpid() and _thread.is_alive():
            return
        _thread_pid = os.getpid()
        _thread = threading.Thread(target=_renew_forever, name="dispatch-lease", daemon=True)
        _thread.start()


def _renew_forever() -> None:
    lease_s = settings.DISPATCH_LEASE_S
    while True:
        time.sleep(max(0.2, lease_s / 3))
        with _lock:
            records = list(_running)
        if not records:
            continue
        until = int((time.time() + lease_s) * 1000)
        try:
            get_redis().zadd(keys.LEASES, {record: until for record in records}, xx=True)
        except Exception:
            logger.warning("lease_renew_failed records=%d", len(records), exc_info=True)


def _after_fork_in_child() -> None:
    # The parent's renewal thread does not exist in the child: start clean.
    global _thread, _thread_pid
    _running.clear()
    _thread = None
    _thread_pid = None


os.register_at_fork(after_in_child=_after_fork_in_child)
