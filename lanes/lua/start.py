"""``start.lua``'s wrapper: claim a task's execution before its handler runs."""

from __future__ import annotations

from typing import Any, NamedTuple

from django.conf import settings

from lanes import counters, keys
from lanes.lua.loader import call

NAME = "start"


class Started(NamedTuple):
    """start.lua's answer. ``status``: 'run' (``detail``: its delivery count; ``config_version``: the
    config in force), 'finished' (``detail``: 'outcome|result JSON'), 'busy' (``detail``: the owner
    holding its claim), 'poison' (``detail``: its delivery count), 'gone', 'stale' or 'nothead'."""

    status: str
    detail: str = ""
    config_version: str = ""

    @property
    def deliveries(self) -> int:
        """How many times it was delivered ('run' and 'poison')."""
        return int(self.detail)


def start(
    *, task_id: str, record: str, chat: str, attempt: int, owner: str, now: float, lease_ms: int,
    max_deliveries: int, dead_owner: str, metric_field: str, queue_latency_bucket: str, queue_latency_s: float,
    process: str, liveness_ms: int,
) -> Started:
    """Run start.lua (KEYS/ARGV in its header).

    With ``DISPATCH_REPLICA_ACKS`` = N > 0, a 'run' reply is returned only once
    N replicas hold the claim, and so (one ordered replication stream) the
    task's admission too; else ``lanes.lua.loader.ReplicaAcksMissing``. A
    handler never runs a task that a failover could forget: the caller, told
    ``unavailable`` for it, would send it again and it would run twice.

    A claim that will run ('run', confirmed) is counted here, in process
    (``lanes.counters``): started, and the queue latency when
    ``queue_latency_bucket`` is set.
    """
    reply = call(
        NAME,
        [record, keys.LEASES, keys.CONFIG_VERSION, keys.chat_queue(chat) if chat else record,
         keys.tombstone(task_id), keys.DEADLINES, keys.PROCS, keys.process_held(process)],
        [task_id, attempt, owner, int(now * 1000), lease_ms, max_deliveries, dead_owner, process, liveness_ms,
         keys.LANE_PREFIX],
        replicas=settings.DISPATCH_REPLICA_ACKS, replicas_timeout_ms=settings.DISPATCH_REPLICA_ACKS_TIMEOUT_MS,
        wait_if=_claimed,
    )
    if _claimed(reply):
        counters.add(f"started|{metric_field}", now)
        counters.observe("qlat", metric_field, queue_latency_bucket, queue_latency_s, now)
    return Started(*(_text(value) for value in reply))


def _claimed(reply: list[Any]) -> bool:
    return bool(reply) and reply[0] == b"run"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
