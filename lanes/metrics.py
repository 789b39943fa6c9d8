"""The engine's metric writes and the counter layout the Lua scripts share; reading them is ``ops.metrics``.

Counters live in an all-time hash (``keys.METRICS_TOTAL``) and one hash per
minute (``keys.metrics_minute``), kept 20 minutes, with fields
``kind|lane|type[|extra]``. Three writers share that layout: each task's own
counts add up in process and are written in batches (``lanes.counters``), the
counts a script must make atomically with its decision (its rejections,
retries, limits, expiries) stay in the Lua scripts, and the few made outside
both (rejections found before admission, dead-letter rows that could not be
written, the maintenance loop's passes) are written here, off the hot path.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from lanes import keys

if TYPE_CHECKING:
    from redis import Redis

#: Recent rejection events kept for the dashboard.
RECENT_REJECTIONS = 100
#: Reasons the admission script counts itself; the others are counted by a receiver.
LUA_COUNTED_REJECTIONS = frozenset({"lane_closed", "lane_full", "chat_queue_full", "idempotency_conflict"})
#: Type label used for dispatches of an unknown type (keeps label cardinality bounded).
UNKNOWN_TYPE = "_unknown"
#: Seconds a minute hash is kept (the scripts use the same).
MINUTE_TTL_S = 1200


def record_rejection(client: Redis, lane: str, type_name: str, reason: str, detail: str, now: float) -> None:
    """Count a rejection the admission script did not count, and remember it for the dashboard.

    One pipelined round trip, on the rejection path only.
    """
    type_label = UNKNOWN_TYPE if reason == "unknown_type" else type_name.replace("|", "_")
    pipe = client.pipeline(transaction=False)
    if reason not in LUA_COUNTED_REJECTIONS:
        name = f"rejected|{lane}|{type_label}|{reason}"
        minute = keys.metrics_minute(int(now // 60))
        pipe.hincrby(keys.METRICS_TOTAL, name, 1)
        pipe.hincrby(minute, name, 1)
        pipe.expire(minute, MINUTE_TTL_S)
    event = {"at": round(now, 3), "lane": lane, "type": type_name[:100], "reason": reason, "detail": detail[:300]}
    pipe.lpush(keys.REJECTIONS_RECENT, json.dumps(event))
    pipe.ltrim(keys.REJECTIONS_RECENT, 0, RECENT_REJECTIONS - 1)
    pipe.execute()


#: Counter field of dead letters whose row could not be written at all (the task still ended).
DEAD_LETTER_WRITE_FAILURES = "dead_letter_write_failures"


def count_dead_letter_write_failure(client: Redis, lane: str, type_name: str) -> None:
    """Count a dead letter that ended in Redis with no row (alert on any increase)."""
    client.hincrby(keys.METRICS_TOTAL, f"{DEAD_LETTER_WRITE_FAILURES}|{lane}|{type_name.replace('|', '_')}", 1)


# --- the maintenance loop's own counters (tasks.maintenance) -------------------

#: Counters of the maintenance loop, summed over every process that runs it.
MAINTENANCE_COUNTS = ("runs", "promoted", "swept", "expired")


def record_maintenance(client: Redis, now: float, *, promoted: int = 0, swept: int = 0, expired: int = 0) -> None:
    """Count one maintenance pass (one pipelined round trip)."""
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(keys.MAINTENANCE_STATS, "runs", 1)
    pipe.hset(keys.MAINTENANCE_STATS, "last_run", f"{now:.3f}")
    for name, value in (("promoted", promoted), ("swept", swept), ("expired", expired)):
        if value:
            pipe.hincrby(keys.MAINTENANCE_STATS, name, int(value))
    pipe.execute()
