"""``pop_more.lua``'s wrapper: more messages for a worker's prefetch window, named in its in-hand set."""

from __future__ import annotations

from collections.abc import Sequence

from redis import Redis

from lanes import keys, leases
from lanes.lua.loader import script

NAME = "pop_more"


def pop_more(client: Redis, lists: Sequence[str], room: int) -> list[tuple[bytes, str]]:
    """Up to ``room`` messages from ``lists`` (highest priority first), each with the record the call
    named in this process's in-hand set ('' for none), on ``client`` (the broker channel's)."""
    me = leases.process_id()
    register = "" if leases.registered() else me
    popped = script(NAME)(keys=[keys.process_in_hand(me), keys.PROCS, *lists],
                          args=[room, register, leases.liveness_expiry_ms()], client=client)
    return [(popped[i], popped[i + 1].decode() if isinstance(popped[i + 1], bytes) else str(popped[i + 1]))
            for i in range(0, len(popped), 2)]
