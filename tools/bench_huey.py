"""Benchmark-only Huey task (an outside reference; ``pip install -r requirements-bench.txt``).

Run by ``huey_consumer tools.bench_huey.huey`` with ``REDIS_URL`` in the
environment, at the consumer's own defaults (one worker thread). Imports
neither Django nor Celery.
"""

from __future__ import annotations

import os
import time

from huey import RedisHuey

from tools.bench_record import record_start

if os.environ.get("DISPATCH_PROBE_DIR"):
    from tools import probe  # noqa: F401 - counts this worker's Redis round trips like the others'

NAME = "bench-huey"
huey = RedisHuey(NAME, url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))


@huey.task()
def huey_work(payload: dict) -> None:
    started = time.time()
    record_start(payload, started)
    ms = payload.get("ms", 0) if isinstance(payload, dict) else 0
    if ms:
        time.sleep(ms / 1000)
