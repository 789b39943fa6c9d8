"""A module-level lock that a forked child gets free.

Billiard forks prefork children while other threads of the worker (the
maintenance thread, the metrics sampler, lease renewal) may hold a module's
lock; the child, where those threads do not exist, would wait on it forever
(found by the poison test). Each lock is released in the child if a thread
held it at the fork.
"""

from __future__ import annotations

import os
import threading
from _thread import LockType


def ForkSafeLock() -> LockType:  # made as the class it was: ``ForkSafeLock()``
    """A ``threading.Lock`` itself, freed in a forked child: ``with`` it runs no Python code (a wrapper's
    ``__enter__`` and ``__exit__`` were two Python calls each time, six times a dispatch)."""
    lock = threading.Lock()
    os.register_at_fork(after_in_child=lambda: _free(lock))
    return lock


def _free(lock: LockType) -> None:
    """In the child, where no other thread exists: a lock one of the parent's threads held is nobody's."""
    if lock.locked():
        lock.release()
