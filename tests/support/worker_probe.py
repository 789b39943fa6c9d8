"""A test-only handler reporting what the pool child running it holds (test_worker_start)."""

from __future__ import annotations

import gc
import os
import sys

from tasks.registry import Context, handler


@handler("test.worker_probe")
def worker_probe(payload: dict, ctx: Context) -> dict:
    """The process's pid, how many objects sit frozen out of the garbage collector, and which of
    ``payload["modules"]`` it has imported."""
    return {"pid": os.getpid(), "frozen": gc.get_freeze_count(),
            "imported": sorted(name for name in payload.get("modules", ()) if name in sys.modules)}
