"""``audit.lua``'s wrapper: repair chats whose head can no longer move (a batch per call)."""

from __future__ import annotations

from lanes import keys
from lanes.lua.loader import script

NAME = "audit"


def audit(*, now_ms: int, batch: int, queued_lease_ms: int) -> list[int]:
    """Returns [chats_checked, heads_handed_over, heads_republished, index_entries_dropped]."""
    reply = script(NAME)(
        keys=[keys.chat_index(), keys.LEASES, keys.CHAT_AUDIT_CURSOR, keys.METRICS_TOTAL,
              keys.metrics_minute(now_ms // 60000)],
        args=[now_ms, batch, queued_lease_ms, keys.CHAT_PREFIX, keys.lane_chat_waiting(""), keys.LIMIT_PREFIX,
              keys.LANE_PREFIX],
    )
    return [int(n) for n in reply]
