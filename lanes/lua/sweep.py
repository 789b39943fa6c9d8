"""``sweep.lua``'s wrapper: republish tasks whose lease expired."""

from __future__ import annotations

from lanes import keys
from lanes.lua.loader import script

NAME = "sweep"


def sweep(*, now_ms: int, batch: int, queued_lease_ms: int, search_depth: int) -> tuple[int, int, int]:
    """Returns (republished, forgotten, still_waiting)."""
    republished, forgotten, waiting = script(NAME)(
        keys=[keys.LEASES, keys.DEADLINES],
        args=[now_ms, batch, queued_lease_ms, keys.lane_delayed(""), keys.BROKER_UNACKED, search_depth],
    )
    return int(republished), int(forgotten), int(waiting)
