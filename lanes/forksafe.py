"""A module-level lock that a forked child gets free.

Billiard forks prefork children while other threads of the worker (the
maintenance thread, the metrics sampler, lease renewal) may hold a module's
lock; the child, where those threads do not exist, would wait on it forever
(found by the poison test). Each instance replaces its lock in the child.
"""

from __future__ import annotations

import os
import threading
from typing import Any


class ForkSafeLock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()
