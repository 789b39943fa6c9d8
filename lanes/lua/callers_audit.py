"""``callers_audit.lua``'s wrapper: recount the lanes' waiting counts and their tokens' counts when one was lost."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import script

NAME = "callers_audit"


class Correction(NamedTuple):
    """One count the recount set right: ``caller`` is a token id, '' for the lane's own waiting count."""

    lane: str
    caller: str
    was: int
    now: int


class CallersAudited(NamedTuple):
    recounted: bool
    corrections: list[Correction]


def audit_callers(*, lanes: Iterable[str], force: bool = False) -> CallersAudited:
    """Check each of ``lanes`` (an HGETALL and a GET); if a tokens' count was lost, or ``force``, recount
    every waiting task in one atomic call (its cost is the backlog's: a command a waiting task)."""
    reply = script(NAME)(keys=[keys.DEADLINES], args=[keys.LANE_PREFIX, "1" if force else "0", *lanes])
    text = [v.decode() if isinstance(v, bytes) else str(v) for v in reply[1:]]
    corrections = [Correction(text[i], text[i + 1], int(text[i + 2]), int(text[i + 3]))
                   for i in range(0, len(text), 4)]
    return CallersAudited(int(reply[0]) == 1, corrections)
