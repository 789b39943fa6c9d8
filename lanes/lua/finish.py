"""``finish.lua``'s wrapper: a task reached a terminal state; its chat moves to the next message."""

from __future__ import annotations

from typing import NamedTuple

from lanes import counters, keys
from lanes.lua.loader import call

NAME = "finish"


class Finished(NamedTuple):
    """finish.lua's answer. ``status``: 'ok' (``detail``: the chat's next task id, or ''), 'already'
    (``detail``: the state it was already in), 'taken' (``detail``: the owner that claimed it since:
    that attempt finishes it) or 'gone'."""

    status: str
    detail: str = ""


def finish(
    *, task_id: str, record: str, chat: str, outcome: str, result_json: str, now: float, tombstone_ttl_s: int,
    queued_lease_ms: int, metric_field: str, reason: str, execution_latency_bucket: str,
    execution_latency_s: float, owner: str, settle_lease_ms: int,
) -> Finished:
    """Run finish.lua (KEYS/ARGV in its header).

    A finish that took ('ok') is counted here, in process (``lanes.counters``):
    succeeded, cancelled or dead (with ``reason``), completed per lane, the execution
    latency and the lane's handler seconds when ``execution_latency_bucket`` is set.
    """
    reply = call(
        NAME,
        [record, keys.LEASES, keys.chat_queue(chat) if chat else record, keys.chat_index(), keys.METRICS_TOTAL,
         keys.metrics_minute(int(now // 60)), keys.tombstone(task_id), keys.DEADLINES],
        [task_id, outcome, result_json, int(now * 1000), tombstone_ttl_s, queued_lease_ms, chat,
         keys.chat_record_prefix(chat) if chat else "", keys.lane_chat_waiting(""), owner, settle_lease_ms,
         keys.LIMIT_PREFIX, keys.LANE_PREFIX],
    )
    answer = Finished(*(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in reply))
    if answer.status == "ok":
        count_finished(metric_field, outcome, reason, execution_latency_bucket, execution_latency_s, now)
    return answer


def count_finished(metric_field: str, outcome: str, reason: str, bucket: str, seconds: float, now: float) -> None:
    """The counts of a task that reached a terminal state, in process (no command in finish.lua)."""
    lane = metric_field.split("|", 1)[0]
    if outcome == "done":
        counters.add(f"succeeded|{metric_field}", now)
    elif outcome == "cancelled":
        counters.add(f"cancelled|{metric_field}", now)
    else:
        counters.add(f"dead|{metric_field}|{reason}", now)
    counters.add(f"completed|{lane}", now)
    counters.observe("xlat", metric_field, bucket, seconds, now)
    if bucket:
        # Handler seconds per lane and minute: admission's estimate of how fast one worker slot drains the lane.
        counters.add(f"busy|{lane}", now, seconds, counters.MINUTE)
