"""``cancel.lua``'s wrapper: cancel waiting tasks, tell running ones, in one Redis call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import call

NAME = "cancel"


class Cancelled(NamedTuple):
    """One target's answer: ``outcome`` is one of cancel.lua's (header), ``detail`` its text;
    ``lane``, ``type`` and ``chat`` of a task cancelled here."""

    task_id: str
    outcome: str
    detail: str
    lane: str = ""
    type: str = ""
    chat: str = ""


def cancel(
    *, now: float, detail: str, detail_json: str, tombstone_ttl_s: int, settle_lease_ms: int, queued_lease_ms: int,
    targets: Sequence[tuple[str, str]] = (), chat: str = "", lane: str = "", waiting_only: bool = False,
) -> list[Cancelled]:
    """Run cancel.lua (KEYS/ARGV in its header) on ``targets`` ((task id, record key) pairs) or,
    with ``chat``, on everything queued for that chat. ``lane``: only tasks of that lane."""
    mode = "chat" if chat else "records"
    reply = call(
        NAME,
        [keys.LEASES, keys.DEADLINES, keys.chat_index(), keys.METRICS_TOTAL, keys.metrics_minute(int(now // 60)),
         keys.chat_queue(chat) if chat else keys.LEASES, *(record for _, record in (() if chat else targets))],
        [int(now * 1000), detail_json, tombstone_ttl_s, keys.tombstone(""), settle_lease_ms, queued_lease_ms,
         keys.CHAT_PREFIX, keys.lane_chat_waiting(""), keys.lane_delayed(""), keys.LIMIT_PREFIX, keys.LANE_PREFIX,
         mode, chat, detail, lane, "1" if waiting_only else "0",
         *(task_id for task_id, _ in (() if chat else targets))],
    )
    return [Cancelled(*(v.decode(errors="replace") for v in reply[i:i + 6])) for i in range(0, len(reply), 6)]
