"""``sweep.lua``'s wrapper: republish tasks whose lease expired."""

from __future__ import annotations

from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import script

NAME = "sweep"


class Swept(NamedTuple):
    republished: int
    forgotten: int
    parked: int  # queued records found waiting in a non-empty lane list: never looked at again while they wait
    commands: int  # Redis commands the call ran (bounded by ``batch``, never by the backlog)


def sweep(*, now_ms: int, batch: int, queued_lease_ms: int) -> Swept:
    reply = script(NAME)(
        keys=[keys.LEASES, keys.DEADLINES],
        args=[now_ms, batch, queued_lease_ms, keys.lane_delayed(""), keys.LANE_PREFIX],
    )
    return Swept(*(int(v) for v in reply))
