"""``limits_audit.lua``'s wrapper: free slots held by tasks that no longer run (a batch)."""

from __future__ import annotations

from lanes import keys
from lanes.lua.loader import script

NAME = "limits_audit"


def audit_limits(*, now_ms: int, batch: int, queued_lease_ms: int, per_instance: int = 200) -> list[int]:
    """Returns [instances_checked, slots_freed]."""
    reply = script(NAME)(
        keys=[keys.LIMIT_DEFS, keys.LIMIT_AUDIT_CURSOR, keys.LEASES, keys.METRICS_TOTAL,
              keys.metrics_minute(now_ms // 60000)],
        args=[now_ms, batch, queued_lease_ms, keys.LIMIT_PREFIX, keys.LANE_PREFIX, per_instance])
    return [int(n) for n in reply]
