"""``pop_more.lua``'s wrapper: a worker's pop of lane messages, each named in its in-hand set (or claimed)."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import NamedTuple

from django.conf import settings
from redis import Redis

from lanes import keys, leases
from lanes.lua.loader import script

NAME = "pop_more"


class Popped(NamedTuple):
    """One message the pop took: ``message`` is a record's stored message (``lanes.messages``) when
    ``tag`` is set, else a whole kombu message as it was pushed; ``record`` the record the call named
    in this process's in-hand set ('' for none), or, when ``owner`` is set, the record it claimed for
    ``owner`` (its attempt may run: ``start.lua``'s 'run'), with ``config_version`` then in force."""

    message: bytes
    record: str
    tag: str
    owner: str = ""
    config_version: str = ""


class PopClaims(NamedTuple):
    """What a pop may claim (the claim at the pop, ``pop_more.lua``'s header): at most ``room`` messages of
    ``handlers``, owned ``<owner_prefix><n>`` (n from 1; the prefix starts with the process id and a colon,
    as every owner's, ``reclaim.lua``)."""

    room: int
    handlers: Collection[str]
    owner_prefix: str


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pop_more(client: Redis, lane: str, lists: Sequence[str], room: int, bits: int | None = None, *,
             book: leases.LeaseBook | None = None, claims: PopClaims | None = None) -> list[Popped]:
    """Up to ``room`` messages of ``lane`` from ``lists`` (its lists, kombu priority 0 first), on
    ``client`` (the broker channel's), for the lease ``book`` (the channel's; else the process's).
    ``bits``: the lists a doorbell token names (bit p: ``lists[p]``); None: every list. ``claims``: what
    the call may claim as it pops (None: nothing)."""
    call = pop_call(lane, lists, room, bits, book=book, claims=claims)
    return popped_of(script(NAME)(keys=call.keys, args=call.args, client=client))


class PopCall(NamedTuple):
    """One ``pop_more.lua`` call's keys and arguments, to send as the script's ``EVALSHA`` (``pop_more``), or
    written behind a ``BRPOP`` on the same connection (``lanes.transport``: Redis runs it as the ``BRPOP``
    returns); ``popped_of`` reads its reply."""

    keys: list[str]
    args: list[str | int | float]

    def command(self) -> list[object]:
        """The call as a command (the script loaded: a ``NOSCRIPT`` error otherwise)."""
        return ["EVALSHA", script(NAME).sha, len(self.keys), *self.keys, *self.args]


def pop_call(lane: str, lists: Sequence[str], room: int, bits: int | None = None, *,
             book: leases.LeaseBook | None = None, claims: PopClaims | None = None) -> PopCall:
    """``pop_more``'s call, its terms as of now (its ``now_ms`` too: a call sent behind a ``BRPOP`` runs up to
    that ``BRPOP``'s timeout later, and its leases and limits then count from a time a little earlier)."""
    me = leases.process_id()
    register = "" if (book or leases.current()).registered() else me
    claim_max, handlers, owner_prefix = 0, "", ""
    if claims is not None and claims.room > 0 and claims.handlers:
        claim_max, owner_prefix = claims.room, claims.owner_prefix
        handlers = "\n" + "\n".join(claims.handlers) + "\n"
    return PopCall(
        keys=[keys.process_in_hand(me), keys.PROCS, keys.lane_doorbell(lane), keys.process_held(me), keys.LEASES,
              keys.CONFIG_VERSION, keys.DEADLINES, *lists],
        args=[room, register, leases.liveness_expiry_ms(), "" if bits is None else bits, claim_max, handlers,
              owner_prefix, int(time.time() * 1000), int(settings.DISPATCH_LEASE_S * 1000),
              settings.DISPATCH_MAX_DELIVERIES, keys.LANE_PREFIX, keys.CHAT_PREFIX,
              int(settings.DISPATCH_QUEUED_LEASE_S * 1000)])


def popped_of(reply: Sequence[bytes | str]) -> list[Popped]:
    """The messages a ``pop_more.lua`` reply carries: the config version in force, then four fields a message."""
    version = _text(reply[0])
    out = []
    for i in range(1, len(reply), 4):
        owner = _text(reply[i + 3])
        out.append(Popped(reply[i], _text(reply[i + 1]), _text(reply[i + 2]), owner, version if owner else ""))  # type: ignore[arg-type]
    return out
