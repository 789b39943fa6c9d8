"""``forget.lua``'s wrappers: settle finished records (and drop them from an index) in one call."""

from __future__ import annotations

from collections.abc import Sequence

from lanes import keys
from lanes.lua.loader import call, script

NAME = "forget"


def forget(records: Sequence[str]) -> int:
    """Remove finished ``records`` and their leases (the lean call of the settling thread)."""
    return int(call(NAME, [keys.LEASES, *records], []))


def forget_expired_pending(records: Sequence[str]) -> int:
    """Remove finished ``records`` and their entries in the expired-pending set (maintenance)."""
    return int(script(NAME)(keys=[keys.EXPIRED_PENDING, *records], args=[]))
