"""``pop_more.lua``'s wrapper: a worker's pop of lane messages, each named in its in-hand set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from redis import Redis

from lanes import keys, leases
from lanes.lua.loader import script

NAME = "pop_more"


class Popped(NamedTuple):
    """One message the pop took: ``message`` is a record's stored message (``lanes.messages``) when
    ``tag`` is set, else a whole kombu message as it was pushed; ``record`` the record the call named
    in this process's in-hand set ('' for none)."""

    message: bytes
    record: str
    tag: str


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pop_more(client: Redis, lane: str, lists: Sequence[str], room: int, bits: int | None = None, *,
             book: leases.LeaseBook | None = None) -> list[Popped]:
    """Up to ``room`` messages of ``lane`` from ``lists`` (its lists, kombu priority 0 first), on
    ``client`` (the broker channel's), for the lease ``book`` (the channel's; else the process's).
    ``bits``: the lists a doorbell token names (bit p: ``lists[p]``); None: every list."""
    me = leases.process_id()
    register = "" if (book or leases.current()).registered() else me
    popped = script(NAME)(keys=[keys.process_in_hand(me), keys.PROCS, keys.lane_doorbell(lane), *lists],
                          args=[room, register, leases.liveness_expiry_ms(), "" if bits is None else bits],
                          client=client)
    return [Popped(popped[i], _text(popped[i + 1]), _text(popped[i + 2])) for i in range(0, len(popped), 3)]
