"""``expire.lua``'s wrapper: waiting tasks whose deadline passed become ``expired`` (a batch)."""

from __future__ import annotations

from typing import Any

from lanes import keys
from lanes.lua.loader import script

NAME = "expire"


def expire(
    *, now: float, batch: int, result_json: str, tombstone_ttl_s: int, queued_lease_ms: int, retry_rows_ms: int,
    search_depth: int,
) -> list[Any]:
    """Returns the flat list {record, message, ...} of expired.lua's header."""
    return script(NAME)(
        keys=[keys.DEADLINES, keys.EXPIRED_PENDING, keys.LEASES, keys.chat_index(), keys.METRICS_TOTAL,
              keys.metrics_minute(int(now // 60))],
        args=[int(now * 1000), batch, result_json, tombstone_ttl_s, queued_lease_ms, keys.CHAT_PREFIX,
              keys.lane_chat_waiting(""), keys.lane_delayed(""), keys.tombstone(""), retry_rows_ms, search_depth,
              keys.LIMIT_PREFIX, keys.LANE_PREFIX],
    )
