"""``finish_batch.lua``'s wrapper: the succeeded items of a batch reach 'done' in one call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from lanes import counters, keys
from lanes.histogram import bucket_label
from lanes.lua.loader import call

NAME = "finish_batch"


class DoneItem(NamedTuple):
    """One succeeded item to finish (the fields ``finish_done_items`` in ``_lib.lua`` reads per item, in its
    order: FINISH_ITEM_FIELDS)."""

    task_id: str
    record: str
    chat: str
    result_json: str
    owner: str
    #: '1': write the task's tombstone; '': not (its type keeps a result row for a success, which answers every
    #: reader once the record is settled: ``tasks.results.keeps_row``). Text, as the script reads it.
    tombstone: str = "1"


class Latencies(NamedTuple):
    """Observations of one latency over a batch: count per bucket label, and their sum in seconds."""

    buckets: dict[str, int]
    sum_s: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latencies:
        buckets: dict[str, int] = {}
        for s in seconds:
            label = bucket_label(s)
            buckets[label] = buckets.get(label, 0) + 1
        return cls(buckets, sum(seconds))


def finish_batch(
    *, items: Sequence[DoneItem], now: float, tombstone_ttl_s: int, queued_lease_ms: int, settle_lease_ms: int,
    metric_field: str, execution: Latencies, busy_s: float, queue: Latencies, counted: bool = True,
) -> list[str]:
    """Run finish_batch.lua (KEYS/ARGV in its header); returns one reply per item, in order.

    The batch's counts are kept here, in process (``lanes.counters``):
    ``queue`` (the queue latencies of the items gathered by claim_batch.lua)
    always; succeeded and completed per 'ok' item, and ``execution`` and the
    lane's handler seconds ``busy_s`` once any item took. No items: no call.
    ``counted`` False: the caller counts (a group's items of several types, ``count_batch`` per type).
    """
    replies: list[str] = []
    if items:
        args: list[object] = [
            int(now * 1000), tombstone_ttl_s, queued_lease_ms, settle_lease_ms, keys.lane_chat_waiting(""),
            keys.LIMIT_PREFIX, keys.LANE_PREFIX, keys.CHAT_PREFIX, keys.tombstone(""),
        ]
        for item in items:
            args.extend(item)
        reply = call(NAME, [keys.LEASES, keys.chat_index(), keys.METRICS_TOTAL, keys.metrics_minute(int(now // 60)),
                            keys.DEADLINES], args)
        replies = [r.decode() if isinstance(r, bytes) else str(r) for r in reply]
    if counted:
        count_batch(metric_field, replies.count("ok"), execution, busy_s, queue, now)
    return replies


def count_batch(metric_field: str, succeeded: int, execution: Latencies, busy_s: float, queue: Latencies,
                now: float) -> None:
    """A batch's counts, in process (the same fields finish and start count one by one)."""
    lane = metric_field.split("|", 1)[0]
    if succeeded:
        counters.add(f"succeeded|{metric_field}", now, succeeded)
        counters.add(f"completed|{lane}", now, succeeded)
        _observe_all("xlat", metric_field, execution, now)
        if busy_s > 0:
            counters.add(f"busy|{lane}", now, busy_s, counters.MINUTE)
    _observe_all("qlat", metric_field, queue, now)


def _observe_all(name: str, metric_field: str, latencies: Latencies, now: float) -> None:
    for label, n in latencies.buckets.items():
        counters.add(f"{name}|{metric_field}|{label}", now, n)
    if latencies.sum_s > 0:
        counters.add(f"{name}_sum|{metric_field}", now, latencies.sum_s, counters.TOTAL)
