"""Benchmark-only tasks (``bench.celery_work``, ``bench.work``, ``bench.work_batch``): the same work for plain
Celery, the platform, and the platform's batched path; and ``bench.mark``, which records that a task ran.

Imported by the benchmark's workers (``celery ... worker -I tools.bench_tasks``)
and by its producer; not part of the platform's runtime. ``payload["ms"]``
milliseconds of sleep stand in for outbound I/O; 0 is a no-op.
"""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task

from lanes import keys
from lanes.redis_client import get_redis
from tasks.registry import handler
from tools.bench_record import record_start

CELERY_QUEUE = "bench-celery"


def work(payload: dict) -> None:
    record_start(payload, time.time())
    ms = payload.get("ms", 0) if isinstance(payload, dict) else 0
    if ms:
        time.sleep(ms / 1000)


@shared_task(name="bench.celery_work", queue=CELERY_QUEUE, acks_late=True, ignore_result=True, typing=False)
def celery_work(payload: dict) -> None:
    """A bare Celery task: acks_late, prefetch 1 (the app's setting), no result stored."""
    work(payload)


@handler("bench.work")
def platform_work(payload: dict, ctx: Any) -> None:
    """The platform's handler doing the same work."""
    work(payload)


@handler("bench.work_batch", batch=True)
def platform_work_batch(items: list) -> list:
    """The batched path: one call for many tasks, whose I/O is one request (the first item's ``ms``)."""
    if items:
        started = time.time()
        for payload, _ctx in items[1:]:
            record_start(payload, started)
        work(items[0][0])
    return [None] * len(items)


def mark_key(run: str) -> str:
    """A bitmap of the ``n`` of every task of ``run`` that ran (``bench.mark``)."""
    return f"{keys.PREFIX}bench:{run}:ran"


def twice_key(run: str) -> str:
    """How many tasks of ``run`` ran a second time (``bench.mark``)."""
    return f"{keys.PREFIX}bench:{run}:twice"


@handler("bench.mark")
def platform_mark(payload: dict, ctx: Any) -> None:
    """Sets bit ``n`` of its run's bitmap, counting a bit already set: exact "each ran once" for a
    million tasks in 125 KB (``tools.backlog``)."""
    r = get_redis()
    if r.setbit(mark_key(payload["run"]), int(payload["n"]), 1):
        r.incr(twice_key(payload["run"]))
