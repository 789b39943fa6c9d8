"""``admit.lua``'s wrapper: admission of one dispatch and its publish, in one Redis call."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from lanes import counters, keys
from lanes.forksafe import ForkSafeLock
from lanes.lua.loader import call

NAME = "admit"
#: Seconds a process reuses a lane's completions, handler seconds, paused flag and live consumers
#: (admission's estimate inputs, nothing it decides by) instead of reading them again: 6 Redis
#: commands a dispatch, now one read a second per lane and process (of a serving lane: ``_healthy``).
ESTIMATE_INPUTS_TTL_S = 1.0
#: Indexes of those inputs in admit.lua's 'ok' reply.
_ESTIMATE_FIELDS = (3, 4, 6, 7, 8, 9)
#: lane -> (monotonic time read, minute, the inputs); a minute's change reads them again.
_estimate_inputs: dict[str, tuple[float, int, tuple[Any, ...]]] = {}
_estimate_lock = ForkSafeLock()


def admit(
    *, version: str, now: float, task_id: str, message: str, kombu_priority: int, lane: str, task_type: str,
    accepting: bool, capacity: int, chat: str, chat_queue_size: int, idempotency_key: str, payload_digest: str,
    idempotency_window_s: int, queued_lease_ms: int, replace_idempotency: bool, deadline: float,
    limits: tuple[str, ...] = (), due: float = 0.0,
) -> list[Any]:
    """Run admit.lua (KEYS/ARGV in its header); returns its reply as Redis sent it.

    An accepted task ('ok') is counted as dispatched here, in process (``count_accepted``); the
    reply's estimate inputs (indexes ``_ESTIMATE_FIELDS``) are this process's reading of the lane
    from up to ``ESTIMATE_INPUTS_TTL_S`` ago.

    ``now`` and ``deadline`` are epoch seconds; ``chat`` and ``idempotency_key``
    are '' when the task has none (``payload_digest`` then too); ``limits`` are
    the task's limit instance bases (``keys.limit_base``), in its type's order;
    ``due`` the epoch seconds a task sent for later is due at (0: now).

    With ``DISPATCH_REPLICA_ACKS`` = N > 0, an 'ok' or 'dup' reply is returned
    only once N replicas hold the write (``WAIT``), so a failover cannot lose a
    task reported accepted; else ``lanes.lua.loader.ReplicaAcksMissing`` (a
    ``RedisError``: dispatch answers ``unavailable``, outcome unknown).
    """
    minute = int(now // 60)
    with _estimate_lock:
        cached = _estimate_inputs.get(lane)
    fresh = cached is not None and cached[1] == minute and time.monotonic() - cached[0] < ESTIMATE_INPUTS_TTL_S
    reply = call(
        NAME, *keys_and_args(
            version=version, now=now, task_id=task_id, message=message, kombu_priority=kombu_priority, lane=lane,
            task_type=task_type, accepting=accepting, capacity=capacity, chat=chat, chat_queue_size=chat_queue_size,
            idempotency_key=idempotency_key, payload_digest=payload_digest,
            idempotency_window_s=idempotency_window_s, queued_lease_ms=queued_lease_ms,
            replace_idempotency=replace_idempotency, deadline=deadline, limits=limits, due=due,
            read_estimate=not fresh,
        ),
        replicas=settings.DISPATCH_REPLICA_ACKS, replicas_timeout_ms=settings.DISPATCH_REPLICA_ACKS_TIMEOUT_MS,
        wait_if=reports_a_task,
    )
    if reply and reply[0] == b"ok":
        count_accepted(reply, {"lane": lane, "task_type": task_type, "now": now})
        if fresh and cached is not None:
            reply = list(reply)
            for index, value in zip(_ESTIMATE_FIELDS, cached[2], strict=True):
                reply[index] = value
        elif _healthy(reply):
            with _estimate_lock:
                _estimate_inputs[lane] = (time.monotonic(), minute, tuple(reply[i] for i in _ESTIMATE_FIELDS))
    return reply


def _healthy(reply: list[Any]) -> bool:
    """A reading worth reusing: the lane is not paused and has a live consumer.

    A paused lane or one without consumers (the estimate then says why there is
    none) is read again at each dispatch, so that a resume or a worker that
    starts shows at once; only a lane that was serving can look so for up to
    ``ESTIMATE_INPUTS_TTL_S`` after it stopped.
    """
    try:
        return int(reply[8]) == 0 and int(reply[9]) > 0
    except (TypeError, ValueError):
        return False


def count_accepted(reply: Any, script_args: Mapping[str, Any]) -> None:
    """Count an accepted task ('ok') as dispatched, in process (``lanes.counters``: no command in the script).

    ``script_args``: the ``keys_and_args`` arguments of its call (``lane``, ``task_type``, ``now``).
    """
    if reply and reply[0] == b"ok":
        count_dispatched(script_args["lane"], script_args["task_type"], script_args["now"])


def count_dispatched(lane: str, task_type: str, now: float, amount: int = 1) -> None:
    """Count ``amount`` tasks of ``task_type`` dispatched into ``lane`` at ``now`` (``count_accepted``'s count,
    which ``dispatch_many`` makes once a chunk)."""
    counters.add(f"dispatched|{lane}|{task_type}", now, amount)


def keys_and_args(
    *, version: str, now: float, task_id: str, message: str, kombu_priority: int, lane: str, task_type: str,
    accepting: bool, capacity: int, chat: str, chat_queue_size: int, idempotency_key: str, payload_digest: str,
    idempotency_window_s: int, queued_lease_ms: int, replace_idempotency: bool, deadline: float,
    limits: tuple[str, ...] = (), due: float = 0.0, read_estimate: bool = True,
) -> tuple[list[Any], list[Any]]:
    """admit.lua's KEYS and ARGV, in the order its header gives.

    ``read_estimate`` False: the caller has the lane's estimate inputs from a recent call (``admit``).
    """
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
        ],
        [
            version, int(now * 1000), task_id, message, kombu_priority, "1" if accepting else "0",
            capacity, chat, chat_queue_size, payload_digest, idempotency_window_s, queued_lease_ms,
            lane, task_type, "1" if replace_idempotency else "0", int(deadline * 1000),
            "\n".join(limits), keys.LIMIT_PREFIX, keys.LANE_PREFIX, int(due * 1000), "1" if read_estimate else "0",
        ],
    )


def reports_a_task(reply: list[Any]) -> bool:
    """Whether admit.lua's reply tells the caller of a stored task ('ok', 'dup')."""
    return reply[0] in (b"ok", b"dup")
