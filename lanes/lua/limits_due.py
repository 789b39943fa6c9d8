"""``limits_due.lua``'s wrapper: drain limit instances whose next task may start now."""

from __future__ import annotations

from lanes import keys
from lanes.lua.loader import script

NAME = "limits_due"


def drain_due(*, now_ms: int, batch: int, queued_lease_ms: int, per_instance: int = 50) -> int:
    """Drain up to ``batch`` due instances; returns how many."""
    return int(script(NAME)(
        keys=[keys.LIMIT_DUE, keys.LEASES, keys.METRICS_TOTAL, keys.metrics_minute(now_ms // 60000)],
        args=[now_ms, batch, queued_lease_ms, keys.LIMIT_PREFIX, keys.LANE_PREFIX, per_instance]))
