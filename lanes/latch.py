"""A one-shot latch: ``threading.Event``'s ``set``/``is_set``/``wait`` for an event never cleared.

``tasks.bulk.Joiner`` makes one for each ``dispatch.delay`` that waits on another thread's turn in
Redis; eight threads dispatching at once make and wake thousands a second. ``threading.Event`` is
a ``Condition`` in Python: its wait allocates a lock, queues it and takes the condition's lock
twice; its set takes that lock and notifies in a Python loop. The latch is one C lock, held from
its making until ``set``: the wait is that lock's ``acquire`` and the set its ``release``.
``tests/unit/test_latch.py`` holds it to ``threading.Event`` across orderings of set and wait.
"""

from __future__ import annotations

from _thread import allocate_lock


class Latch:
    """Set once; a later ``set`` changes nothing, as an ``Event``'s does."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if self._set:
            return
        self._set = True  # before the release: a wait that finds it True need not take the lock
        try:
            self._lock.release()
        except RuntimeError:  # two sets at once both passed the check: the other released it
            pass

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it is set, waiting up to ``timeout`` seconds for it (None: until it is)."""
        if self._set:
            return True
        if timeout is None:
            got = self._lock.acquire()
        elif timeout > 0:
            got = self._lock.acquire(True, timeout)
        else:
            got = self._lock.acquire(False)
        if got:
            try:
                self._lock.release()  # the lock stays free once set: every later wait takes it at once
            except RuntimeError:  # a second of two sets at once released it under this wait
                pass
        return got or self._set
