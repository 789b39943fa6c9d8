"""``reclaim.lua``'s wrapper: hand on what dead worker processes held."""

from __future__ import annotations

from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import call

NAME = "reclaim"


class Reclaimed(NamedTuple):
    processes: int  # dead processes whose claims were handed on (vouched-for ones are not counted)
    examined: int  # records looked at: what those processes held, never the backlog
    republished: int
    commands: int  # Redis commands the call ran (bounded by what the dead processes held)


def reclaim(*, now_ms: int, max_processes: int, queued_lease_ms: int) -> Reclaimed:
    reply = call(NAME, [keys.PROCS, keys.PROCS_VOUCHED, keys.LEASES, keys.DEADLINES],
                 [now_ms, max_processes, keys.HELD_PREFIX, keys.IN_HAND_PREFIX, queued_lease_ms, keys.LANE_PREFIX])
    return Reclaimed(*(int(v) for v in reply))
