"""``promote.lua``'s wrapper: move a lane's due retries onto the lane."""

from __future__ import annotations

from lanes import keys
from lanes.lua.loader import script

NAME = "promote"


def promote(*, lane: str, now_ms: int, batch: int, queued_lease_ms: int) -> int:
    """Publish up to ``batch`` due retries of ``lane``; returns how many."""
    minute = now_ms // 60000
    return int(script(NAME)(
        keys=[keys.lane_delayed(lane), keys.LEASES, keys.METRICS_TOTAL, keys.metrics_minute(minute)],
        args=[now_ms, batch, queued_lease_ms, keys.LIMIT_PREFIX, keys.LANE_PREFIX]))
