"""Benchmark-only taskiq task (an outside reference; ``pip install -r requirements-bench.txt``).

Run by ``taskiq worker tools.bench_taskiq:broker`` with ``REDIS_URL`` in the
environment, at the worker's own defaults (2 processes, up to 100 tasks in
flight each). The broker is the one taskiq-redis's README starts with,
``RedisStreamBroker`` (acknowledged, like the other systems' deliveries), with
no result backend. The task is ``async``, as taskiq's docs write them: its
20 ms of I/O is an ``asyncio.sleep``. Imports neither Django nor Celery.
"""

from __future__ import annotations

import asyncio
import os
import time

from taskiq_redis import RedisStreamBroker

from tools.bench_record import record_start

if os.environ.get("DISPATCH_PROBE_DIR"):
    from tools import probe  # noqa: F401 - counts sync redis-py round trips (taskiq's are asyncio: not counted)

#: The stream taskiq-redis keeps its queue in, and the consumer group its workers read it as (its defaults).
STREAM, GROUP = "taskiq", "taskiq"
broker = RedisStreamBroker(url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))


@broker.task(task_name="bench.taskiq_work")
async def taskiq_work(payload: dict) -> None:
    started = time.time()
    record_start(payload, started)
    ms = payload.get("ms", 0) if isinstance(payload, dict) else 0
    if ms:
        await asyncio.sleep(ms / 1000)
