"""``expire.lua``'s wrapper: waiting tasks whose deadline passed become ``expired`` (a batch)."""

from __future__ import annotations

from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import script

NAME = "expire"


class Expired(NamedTuple):
    """A task expired while it waited (now, or earlier with rows not confirmed written): the caller
    writes its rows, then settles ``record`` (``forget.forget_expired_pending``)."""

    record: str
    #: The message its record kept (``lanes.messages``' stored form; a whole message with a NUL for the tag if older).
    message: bytes


def expire(
    *, now: float, batch: int, result_json: str, tombstone_ttl_s: int, queued_lease_ms: int, retry_rows_ms: int,
    search_depth: int,
) -> list[Expired]:
    """Expire up to ``batch`` waiting tasks whose deadline passed (expire.lua's header); returns them and those
    whose rows a caller took ``retry_rows_ms`` ago or more and did not confirm."""
    reply = script(NAME)(
        keys=[keys.DEADLINES, keys.EXPIRED_PENDING, keys.LEASES, keys.chat_index(), keys.METRICS_TOTAL,
              keys.metrics_minute(int(now // 60))],
        args=[int(now * 1000), batch, result_json, tombstone_ttl_s, queued_lease_ms, keys.CHAT_PREFIX,
              keys.lane_chat_waiting(""), keys.lane_delayed(""), keys.tombstone(""), retry_rows_ms, search_depth,
              keys.LIMIT_PREFIX, keys.LANE_PREFIX],
    )
    return [Expired(record.decode(), message) for record, message in zip(reply[::2], reply[1::2], strict=True)]
