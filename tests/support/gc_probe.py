"""A test-only handler that reports what the collector sees in the pool child running it (test_worker_start)."""

from __future__ import annotations

import gc
import os

from tasks.registry import Context, handler


@handler("test.gc_probe")
def gc_probe(payload: dict, ctx: Context) -> dict:
    """The running process's pid and how many objects sit frozen out of the garbage collector."""
    return {"pid": os.getpid(), "frozen": gc.get_freeze_count()}
