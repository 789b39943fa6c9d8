"""``audit.lua``'s wrapper: repair chats whose head can no longer move (a batch per call)."""

from __future__ import annotations

from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import script

NAME = "audit"


class Audited(NamedTuple):
    chats_checked: int
    heads_handed_over: int  # heads that had finished: their chat moved on
    heads_republished: int  # heads neither running nor published: published again
    index_entries_dropped: int  # chats in the index with no queue left


def audit(*, now_ms: int, batch: int, queued_lease_ms: int) -> Audited:
    reply = script(NAME)(
        keys=[keys.chat_index(), keys.LEASES, keys.CHAT_AUDIT_CURSOR, keys.METRICS_TOTAL,
              keys.metrics_minute(now_ms // 60000)],
        args=[now_ms, batch, queued_lease_ms, keys.CHAT_PREFIX, keys.lane_chat_waiting(""), keys.LIMIT_PREFIX,
              keys.LANE_PREFIX],
    )
    return Audited(*(int(n) for n in reply))
