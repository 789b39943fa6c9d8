"""``limits_audit.lua``'s wrapper: free slots held by tasks that no longer run (a batch)."""

from __future__ import annotations

from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import script

NAME = "limits_audit"


class LimitsAudited(NamedTuple):
    instances_checked: int
    slots_freed: int


def audit_limits(*, now_ms: int, batch: int, queued_lease_ms: int, per_instance: int = 200) -> LimitsAudited:
    reply = script(NAME)(
        keys=[keys.LIMIT_DEFS, keys.LIMIT_AUDIT_CURSOR, keys.LEASES, keys.METRICS_TOTAL,
              keys.metrics_minute(now_ms // 60000)],
        args=[now_ms, batch, queued_lease_ms, keys.LIMIT_PREFIX, keys.LANE_PREFIX, per_instance])
    return LimitsAudited(*(int(n) for n in reply))
