"""``finish_batch.lua``'s wrapper: the succeeded items of a batch reach 'done' in one call."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import call

NAME = "finish_batch"


class DoneItem(NamedTuple):
    task_id: str
    record: str
    chat: str
    result_json: str
    owner: str


class Latencies(NamedTuple):
    """Observations of one latency over a batch: count per bucket label, and their sum in seconds."""

    buckets: dict[str, int]
    sum_s: float


def finish_batch(
    *, items: Sequence[DoneItem], now: float, tombstone_ttl_s: int, queued_lease_ms: int, settle_lease_ms: int,
    metric_field: str, execution: Latencies, busy_s: float, queue: Latencies,
) -> list[str]:
    """Run finish_batch.lua (KEYS/ARGV in its header); returns one reply per item, in order."""
    args: list[object] = [
        int(now * 1000), tombstone_ttl_s, queued_lease_ms, settle_lease_ms, metric_field, keys.lane_chat_waiting(""),
        keys.LIMIT_PREFIX, keys.LANE_PREFIX, keys.CHAT_PREFIX, keys.tombstone(""),
        json.dumps({"buckets": execution.buckets, "sum": round(execution.sum_s, 6), "busy": round(busy_s, 6)}),
        json.dumps({"buckets": queue.buckets, "sum": round(queue.sum_s, 6)}),
    ]
    for item in items:
        args.extend(item)
    reply = call(NAME, [keys.LEASES, keys.chat_index(), keys.METRICS_TOTAL, keys.metrics_minute(int(now // 60)),
                        keys.DEADLINES], args)
    return [r.decode() if isinstance(r, bytes) else str(r) for r in reply]
