"""``ring.lua``'s wrapper: ring a lane's doorbell after a push made by the broker channel itself."""

from __future__ import annotations

from redis import Redis

from lanes import keys
from lanes.lua.loader import script

NAME = "ring"


def ring(client: Redis, lane: str, bits: int) -> None:
    """Tell ``lane``'s idle workers that its lists named by ``bits`` (bit p: kombu priority p) were
    pushed to (on ``client``)."""
    script(NAME)(keys=[keys.lane_doorbell(lane)], args=[bits], client=client)
