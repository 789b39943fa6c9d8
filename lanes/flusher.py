"""One background writer per process for an in-process buffer (the counters, the task histories).

A daemon thread calls ``flush`` every ``every_s`` while ``pending()`` says there is something to
write. It starts on first use, and again in a forked child, where the parent's thread does not
exist (the pid it was started in tells). What to write, and clearing it in a child, stay with the
buffer's module.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from lanes.forksafe import ForkSafeLock

logger = logging.getLogger(__name__)


class Flusher:
    def __init__(self, name: str, every_s: float, flush: Callable[[], Any], pending: Callable[[], bool]) -> None:
        self.name = name
        self._every_s = every_s
        self._flush = flush
        self._pending = pending
        self._lock = ForkSafeLock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None

    def ensure(self) -> None:
        """The thread runs in this process (cheap when it already does: called on every buffered write)."""
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._forever, name=f"dispatch-{self.name}", daemon=True)
            self._thread.start()

    def flush_quietly(self, *_args: Any, **_kwargs: Any) -> None:
        """``flush()`` for the thread, exit hooks and signal receivers: never raises."""
        try:
            self._flush()
        except Exception:  # at exit, what was buffered lost is all that can go wrong
            logger.warning("%s_flush_at_exit_failed", self.name, exc_info=True)

    def _forever(self) -> None:
        while True:
            time.sleep(self._every_s)
            if self._pending():
                self.flush_quietly()
