"""``admit.lua``'s wrapper: admission of one dispatch and its publish, in one Redis call."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from lanes import keys
from lanes.lua.loader import ScriptStream, call

NAME = "admit"


def admit(
    *, version: str, now: float, task_id: str, message: str, kombu_priority: int, lane: str, task_type: str,
    accepting: bool, capacity: int, chat: str, chat_queue_size: int, idempotency_key: str, payload_digest: str,
    idempotency_window_s: int, queued_lease_ms: int, replace_idempotency: bool, deadline: float,
    limits: tuple[str, ...] = (), due: float = 0.0,
) -> list[Any]:
    """Run admit.lua (KEYS/ARGV in its header); returns its reply as Redis sent it.

    ``now`` and ``deadline`` are epoch seconds; ``chat`` and ``idempotency_key``
    are '' when the task has none (``payload_digest`` then too); ``limits`` are
    the task's limit instance bases (``keys.limit_base``), in its type's order;
    ``due`` the epoch seconds a task sent for later is due at (0: now).

    With ``DISPATCH_REPLICA_ACKS`` = N > 0, an 'ok' or 'dup' reply is returned
    only once N replicas hold the write (``WAIT``), so a failover cannot lose a
    task reported accepted; else ``lanes.lua.loader.ReplicaAcksMissing`` (a
    ``RedisError``: dispatch answers ``unavailable``, outcome unknown).
    """
    return call(
        NAME, *keys_and_args(
            version=version, now=now, task_id=task_id, message=message, kombu_priority=kombu_priority, lane=lane,
            task_type=task_type, accepting=accepting, capacity=capacity, chat=chat, chat_queue_size=chat_queue_size,
            idempotency_key=idempotency_key, payload_digest=payload_digest,
            idempotency_window_s=idempotency_window_s, queued_lease_ms=queued_lease_ms,
            replace_idempotency=replace_idempotency, deadline=deadline, limits=limits, due=due,
        ),
        replicas=settings.DISPATCH_REPLICA_ACKS, replicas_timeout_ms=settings.DISPATCH_REPLICA_ACKS_TIMEOUT_MS,
        wait_if=reports_a_task,
    )


def stream() -> ScriptStream:
    """A ``ScriptStream`` of admit.lua calls (``keys_and_args`` of each): many admissions, one round trip a batch."""
    return ScriptStream(NAME)


def keys_and_args(
    *, version: str, now: float, task_id: str, message: str, kombu_priority: int, lane: str, task_type: str,
    accepting: bool, capacity: int, chat: str, chat_queue_size: int, idempotency_key: str, payload_digest: str,
    idempotency_window_s: int, queued_lease_ms: int, replace_idempotency: bool, deadline: float,
    limits: tuple[str, ...] = (), due: float = 0.0,
) -> tuple[list[Any], list[Any]]:
    """admit.lua's KEYS and ARGV, in the order its header gives."""
    minute = int(now // 60)
    record = keys.task_record(task_id, chat or None)
    return (
        [
            keys.CONFIG_VERSION, record, keys.LEASES,
            keys.idempotency(task_type, idempotency_key) if idempotency_key else record,
            keys.chat_queue(chat) if chat else record,
            keys.lane_chat_waiting(lane), keys.lane_delayed(lane), keys.METRICS_TOTAL,
            keys.metrics_minute(minute), keys.chat_index(), *keys.lane_queues(lane),
            keys.metrics_minute(minute - 1),
            keys.legacy_idempotency(task_type, idempotency_key) if idempotency_key else record,
            keys.DEADLINES, keys.PAUSED_LANES, keys.lane_consumers(lane), keys.lane_limited(lane),
            keys.task_chat(task_id),
        ],
        [
            version, int(now * 1000), task_id, message, kombu_priority, "1" if accepting else "0",
            capacity, chat, chat_queue_size, payload_digest, idempotency_window_s, queued_lease_ms,
            lane, task_type, "1" if replace_idempotency else "0", int(deadline * 1000),
            "\n".join(limits), keys.LIMIT_PREFIX, keys.LANE_PREFIX, int(due * 1000),
        ],
    )


def reports_a_task(reply: list[Any]) -> bool:
    """Whether admit.lua's reply tells the caller of a stored task ('ok', 'dup')."""
    return reply[0] in (b"ok", b"dup")
