"""Benchmark-only Dramatiq actor (an outside reference; ``pip install -r requirements-bench.txt``).

Run by ``dramatiq tools.bench_dramatiq -p P -t T -Q bench-dramatiq`` with
``REDIS_URL`` in the environment. Imports neither Django nor Celery.
"""

from __future__ import annotations

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from tools.bench_record import record_start

if os.environ.get("DISPATCH_PROBE_DIR"):
    from tools import probe  # noqa: F401 - counts this worker's Redis round trips like the others'

QUEUE = "bench-dramatiq"
broker = RedisBroker(url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def dramatiq_work(payload: dict) -> None:
    record_start(payload, time.time())
    ms = payload.get("ms", 0) if isinstance(payload, dict) else 0
    if ms:
        time.sleep(ms / 1000)
