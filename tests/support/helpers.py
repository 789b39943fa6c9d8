"""Small helpers shared by the integration tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def define(
    type_name: str,
    *,
    handler: str = "demo.echo",
    lane: str = "t-default",
    policy: dict | None = None,
    capacity: int = 100000,
    **fields: Any,
):
    """Create (or update) a lane, a retry policy and a task type through the ORM."""
    from lanes.models import Lane
    from tasks.models import RetryPolicy, TaskType

    lane_obj, _ = Lane.objects.update_or_create(name=lane, defaults={"capacity": capacity, "accepting": True})
    policy = {"max_retries": 3, "initial_backoff": 0.1, "multiplier": 2.0, "max_backoff": 1.0, "jitter": 0.1,
              **(policy or {})}
    policy_obj, _ = RetryPolicy.objects.update_or_create(name=f"p-{type_name}", defaults=policy)
    defaults = {"handler": handler, "lane": lane_obj, "retry_policy": policy_obj, "timeout": 60,
                "attempt_timeout": 10, **fields}
    tt, _ = TaskType.objects.update_or_create(name=type_name, defaults=defaults)
    tt.full_clean()
    return tt


def lane_depth(client, lane: str) -> int:
    from lanes import keys

    return sum(client.llen(k) for k in keys.lane_queues(lane))


def lane_holds_nothing(client, lane: str, records: tuple[str, ...] = ()) -> bool:
    """Nothing in Redis could still deliver a message of ``lane``: no queued or delayed message, none
    in kombu's unacked hash routed to it, and none of ``records`` (task records) left to claim."""
    import json

    from lanes import keys

    if lane_depth(client, lane) or client.zcard(keys.lane_delayed(lane)) or (records and client.exists(*records)):
        return False
    return not any(json.loads(v)[2] == lane for v in client.hvals("unacked"))


def wait_for_redelivery_room(client, lane: str, most_s: float, records: tuple[str, ...] = ()) -> None:
    """Give a wrong redelivery on ``lane`` up to ``most_s`` s to show, less once nothing could deliver one.

    A task's record carries its message under a lease until its result row is stored
    (``lanes/transport.py``): a copy a worker holds in memory runs only if its claim finds the
    record, so ``records`` must name the tasks a redelivery would be of. Redis must hold nothing
    over two polls 0.25 s apart.
    """
    end = time.monotonic() + most_s
    quiet = 0
    while time.monotonic() < end:
        quiet = quiet + 1 if lane_holds_nothing(client, lane, records) else 0
        if quiet >= 2:
            return
        time.sleep(min(0.25, max(0.0, end - time.monotonic())))


def sweep_reaching(client, record: str, passes: int = 50) -> int:
    """Lease sweeps until ``record``'s expired lease was handled; returns what they republished.

    A pass takes at most ``SWEEP_CALLS`` x ``SWEEP_BATCH`` expired leases, oldest first, and the
    session's Redis holds earlier tests' tasks too: one pass may not reach a lease a test just
    made expire.
    """
    import time

    from lanes import keys
    from tasks import maintenance

    republished = 0
    for _ in range(passes):
        done, _forgotten = maintenance.sweep()
        republished += done
        score = client.zscore(keys.LEASES, record)
        if score is None or score > time.time() * 1000:
            break
    return republished


def first_starts(task_ids) -> list[float]:
    """When each task's first attempt began, by its worker's clock right after the claim (its history's
    ``started`` event), sorted: a limit's grants, without the jitter of a request reaching a sink."""
    from tasks import history_view

    return sorted(history_view.read(task_id).attempts[0].started_at for task_id in task_ids)


def busiest_second(times: list[float]) -> int:
    """The most of ``times`` (sorted) in any window of one second."""
    return max((sum(1 for x in times[i:] if x < s + 1.0) for i, s in enumerate(times)), default=0)
