"""The worker groups ``make run`` starts, defined once: ``scripts/run.py`` starts them, the measuring tools copy them.

Sized for I/O-bound outbound work on a small machine (BENCHMARKS.md): one Celery
main process costs about 0.4-0.7 ms of CPU per message whatever its pool, so
throughput scales with worker *instances* (two: one a core); a thread pool keeps
many 20 ms calls in flight per instance (16 threads x 2 instances x 20 ms: a
ceiling of about 1,600 messages/s for the 1,000/s target). ``manage.py smsload``
starts the realtime group's shape (:func:`realtime_shape`), so what it measures
is what ``make run`` runs. ``default`` also consumes Celery's default queue
``celery``, so a bare client's ``send_task("tasks.dispatch")`` is served.

Pure: no Django, Celery or Redis import (``scripts/run.py`` reads it before Django is set up).
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

DEFAULT_GROUPS: dict[str, dict[str, Any]] = {
    "realtime": {"queues": "realtime", "pool": "threads", "concurrency": 16, "instances": 2},
    # The default group also consumes every lane no other live worker holds (lanes
    # created at run time included: lanes.consumers), and Celery's own default queue
    # `celery`, so a bare client's send_task("tasks.dispatch") is not stranded.
    "default": {"queues": "default,ingress,celery", "pool": "threads", "concurrency": 8, "instances": 1,
                "catch_all": True},
    "bulk": {"queues": "bulk", "pool": "threads", "concurrency": 8, "instances": 1},
}


def worker_groups(environ: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Each group's queues, pool, concurrency and instances.

    Precedence: ``WORKER_<GROUP>_POOL`` / ``_CONCURRENCY`` / ``_INSTANCES``, then
    ``WORKER_POOL`` / ``WORKER_CONCURRENCY`` for every group, then the group's
    entry in ``WORKER_GROUPS`` (``{"name": "queues"}`` or ``{"name": {"queues": …,
    "pool": …, "concurrency": …, "instances": …}}``), then :data:`DEFAULT_GROUPS`.
    """
    env = os.environ if environ is None else environ
    raw = json.loads(env["WORKER_GROUPS"]) if env.get("WORKER_GROUPS") else DEFAULT_GROUPS
    groups = {}
    for name, spec in raw.items():
        spec = {"queues": spec} if isinstance(spec, str) else dict(spec)
        base = DEFAULT_GROUPS.get(name, DEFAULT_GROUPS["default"])
        group = {key: spec.get(key, base[key]) for key in ("pool", "concurrency", "instances")}
        group["queues"] = spec.get("queues") or base["queues"]
        upper = name.upper().replace("-", "_")
        for key in ("pool", "concurrency", "instances"):
            override = env.get(f"WORKER_{upper}_{key.upper()}") or (
                env.get(f"WORKER_{key.upper()}") if key != "instances" else None)
            if override:
                group[key] = override
        group["concurrency"], group["instances"] = int(group["concurrency"]), max(1, int(group["instances"]))
        inherited = base.get("catch_all", False) if name in DEFAULT_GROUPS else False
        group["catch_all"] = bool(spec.get("catch_all", inherited))
        groups[name] = group
    return groups


class Shape(NamedTuple):
    """One group's worker processes and the pool each runs."""

    instances: int
    pool: str
    concurrency: int


def realtime_shape(environ: dict[str, str] | None = None) -> Shape:
    """The realtime group's shape as ``make run`` would start it in ``environ`` (its overrides included)."""
    group = worker_groups(environ).get("realtime") or worker_groups({})["realtime"]
    return Shape(int(group["instances"]), str(group["pool"]), int(group["concurrency"]))
