"""``audit.lua``'s wrapper: repair chats whose head can no longer move, and tasks whose copy a worker lost
unclaimed (a batch of each per call)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import script

NAME = "audit"


class Repair(NamedTuple):
    """One chat the audit moved on: its head ``task_id`` and why it could not move by itself."""

    lane: str
    chat: str
    task_id: str
    cause: str


class Audit(NamedTuple):
    checked: int
    handed_over: int
    republished: int
    dropped: int
    repairs: list[Repair]


#: A hold no head reaches (``held_default_ms=None``): only heads that vanished or lost their lease are repaired.
NEVER_MS = 2**53


def audit(*, now_ms: int, batch: int, queued_lease_ms: int, held_ms: Mapping[str, int] | None = None,
          held_default_ms: int | None = None, parked_batch: int = 50) -> Audit:
    """Check ``batch`` chats of the index (from the cursor on). ``held_ms``: by task type, how long a head
    may be held (its attempt limit plus the lease) before an owner that cannot move it counts as stuck;
    ``held_default_ms`` for a type not in it; ``parked_batch`` parked leases looked at (queued tasks the
    sweep left waiting in their lane list, of a chat or of none), and as many waiting tasks (the deadlines
    set: a published one with no lease whose lane list is empty lost its copy)."""
    reply = script(NAME)(
        keys=[keys.chat_index(), keys.LEASES, keys.CHAT_AUDIT_CURSOR, keys.METRICS_TOTAL,
              keys.metrics_minute(now_ms // 60000), keys.DEADLINES, keys.PROCS, keys.PROCS_VOUCHED,
              keys.PARKED_AUDIT_CURSOR, keys.WAITING_AUDIT_CURSOR],
        args=[now_ms, batch, queued_lease_ms, keys.CHAT_PREFIX, keys.lane_chat_waiting(""), keys.LIMIT_PREFIX,
              keys.LANE_PREFIX, keys.HELD_PREFIX, json.dumps(dict(held_ms or {})),
              NEVER_MS if held_default_ms is None else held_default_ms, parked_batch],
    )
    checked, handed_over, republished, dropped = (int(n) for n in reply[:4])
    text = [v.decode() if isinstance(v, bytes) else str(v) for v in reply[4:]]
    repairs = [Repair(*text[i:i + 4]) for i in range(0, len(text), 4)]
    return Audit(checked, handed_over, republished, dropped, repairs)
