"""What one Redis carries: the measured cost of a task per path, and the arithmetic on it.

Redis runs every command on one core and keeps every waiting task in memory,
so one deployment's ceiling is two numbers per path: Redis CPU per task
(tasks/s per core) and bytes per waiting task (backlog per GiB). They are
measured, not derived (docs/scaling.md says how; ``manage.py memory`` and
``manage.py benchmark`` measure them again), kept here once, and read by
``manage.py capacity``, the dashboard's memory room and admission's memory
guard. Pure: no Redis, Django or Celery import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024 ** 3


@dataclass(frozen=True)
class PathCost:
    """One path's measured cost per task."""

    #: Redis CPU per task, dispatch to settled (µs): the Redis process' CPU time over a run / tasks.
    redis_cpu_us: float
    #: Commands Redis ran per task (``INFO commandstats``, those inside scripts counted).
    commands: float
    #: Redis memory per waiting task (bytes): ``used_memory`` after - before a fill / tasks.
    bytes_waiting: float


#: Measured on the development machine (2 cores shared with other jobs, load 6-9, Redis 6.2.5), 2026-12-01:
#: CPU and commands by ``manage.py benchmark --rounds 1 --tasks 1000 --workloads noop --instances 1`` (rows
#: platform, chat, limited, batch, batch-bulk), bytes by ``manage.py memory --tasks 20000`` with
#: ``REDIS_CONFIG`` (below), 2026-12-02, the lane list naming the record and the record holding the
#: message compact (``lanes.messages``); docs/scaling.md.
#: A batched type's record and message are a plain type's (the batch is made at the claim).
PATHS: dict[str, PathCost] = {
    "plain": PathCost(redis_cpu_us=370.0, commands=26.5, bytes_waiting=842.0),
    "chat": PathCost(redis_cpu_us=420.0, commands=35.5, bytes_waiting=762.0),
    "limited": PathCost(redis_cpu_us=390.0, commands=47.6, bytes_waiting=850.0),
    "batched": PathCost(redis_cpu_us=110.0, commands=14.3, bytes_waiting=842.0),
    "bulk": PathCost(redis_cpu_us=60.0, commands=6.5, bytes_waiting=842.0),
}
#: Redis settings the platform's own Redis runs with (``make run``'s config file, the tests' Redis), and
#: that docs/scaling.md asks of any other. A waiting task's record holds its message (about 200 bytes
#: stored compact; 1.1 KB when it was kombu's whole message), so with Redis's default (64 bytes) every
#: record is a hash table. Under 2,048 it stays one compact listpack (ziplist in Redis 6.2): 424 bytes
#: (1,048 with the whole message), the same fields and commands; a larger payload makes that one record
#: a hash table again, as before.
REDIS_CONFIG = {"hash-max-ziplist-value": "2048"}
#: An empty platform's Redis (scripts, config, counters, a few lanes): bytes.
BASELINE_BYTES = 2 * 1024 * 1024
#: Share of one core to plan for: the rest is for bursts, maintenance sweeps, the dashboard.
CORE_TARGET = 0.7
#: Default share of ``maxmemory`` past which admission refuses new work (``DISPATCH_MEMORY_HIGH``):
#: the rest is for what accepted tasks still write (claims, lease renewals, outcomes, tombstones).
MEMORY_HIGH_DEFAULT = 0.9


@dataclass(frozen=True)
class Plan:
    """What a load needs of Redis (``plan``)."""

    path: str
    rate: float
    backlog: int
    cores: float  # Redis cores at CORE_TARGET
    deployments: int  # one Redis core each (Redis runs commands on one core)
    memory_bytes: int  # the backlog plus the baseline
    maxmemory_bytes: int  # what to set so the backlog fits below the admission guard

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    @property
    def maxmemory_gib(self) -> float:
        return self.maxmemory_bytes / GIB


def cost(path: str) -> PathCost:
    """The measured cost of ``path``; a ValueError naming the known paths otherwise."""
    try:
        return PATHS[path]
    except KeyError:
        raise ValueError(f"unknown path {path!r}; choose from {', '.join(PATHS)}") from None


def tasks_per_core(path: str, target: float = CORE_TARGET) -> float:
    """Tasks/s one Redis core carries on ``path`` at ``target`` of the core."""
    return target * 1e6 / cost(path).redis_cpu_us


def backlog_per_gib(path: str) -> int:
    """Waiting tasks of ``path`` one GiB holds (past the baseline)."""
    return int((GIB - BASELINE_BYTES) / cost(path).bytes_waiting)


def plan(rate: float, backlog: int, path: str = "plain", high: float = MEMORY_HIGH_DEFAULT) -> Plan:
    """Redis cores and memory for ``rate`` tasks/s with up to ``backlog`` waiting, on ``path``."""
    if rate < 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be a number of tasks/s >= 0, not {rate!r}")
    if backlog < 0:
        raise ValueError(f"backlog must be a number of tasks >= 0, not {backlog!r}")
    if not 0 < high <= 1:
        raise ValueError(f"the memory guard's share must be in (0, 1], not {high!r}")
    c = cost(path)
    cores = rate * c.redis_cpu_us / 1e6 / CORE_TARGET
    memory = int(BASELINE_BYTES + backlog * c.bytes_waiting)
    return Plan(path=path, rate=rate, backlog=backlog, cores=cores, deployments=max(1, math.ceil(cores)),
                memory_bytes=memory, maxmemory_bytes=int(memory / high))


def memory_limit(maxmemory: int, high: float = MEMORY_HIGH_DEFAULT) -> int | None:
    """Bytes of ``used_memory`` past which admission refuses; None without a ``maxmemory`` (0)."""
    return int(maxmemory * high) if maxmemory > 0 else None


def room_tasks(used: int, limit: int | None, bytes_per_task: float) -> int | None:
    """Waiting tasks that still fit below ``limit`` at ``bytes_per_task``; None when there is no limit."""
    if limit is None or bytes_per_task <= 0:
        return None
    return max(0, int((limit - used) / bytes_per_task))
