"""``pop_more.lua``'s wrapper: a worker's pop of lane messages, each named in its in-hand set."""

from __future__ import annotations

from collections.abc import Sequence

from redis import Redis

from lanes import keys, leases
from lanes.lua.loader import script

NAME = "pop_more"


def pop_more(client: Redis, lane: str, lists: Sequence[str], room: int, bits: int | None = None, *,
             book: leases.LeaseBook | None = None) -> list[tuple[bytes, str]]:
    """Up to ``room`` messages of ``lane`` from ``lists`` (its lists, kombu priority 0 first), each with
    the record the call named in this process's in-hand set ('' for none), on ``client`` (the broker
    channel's), for the lease ``book`` (the channel's; else the process's). ``bits``: the lists a doorbell
    token names (bit p: ``lists[p]``); None: every list."""
    me = leases.process_id()
    register = "" if (book or leases.current()).registered() else me
    popped = script(NAME)(keys=[keys.process_in_hand(me), keys.PROCS, keys.lane_doorbell(lane), *lists],
                          args=[room, register, leases.liveness_expiry_ms(), "" if bits is None else bits],
                          client=client)
    return [(popped[i], popped[i + 1].decode() if isinstance(popped[i + 1], bytes) else str(popped[i + 1]))
            for i in range(0, len(popped), 2)]
