"""Our priority (0..9, higher more urgent) against kombu's Redis lists (0 served first)."""

from __future__ import annotations

LOWEST, HIGHEST = 0, 9


def to_kombu(priority: int) -> int:
    """Kombu's Redis transport pops list ``lane`` before ``lane:1`` ... ``lane:9``."""
    if not LOWEST <= priority <= HIGHEST:
        raise ValueError(f"priority must be {LOWEST}..{HIGHEST}, not {priority}")
    return HIGHEST - priority


def from_kombu(kombu_priority: int) -> int:
    return HIGHEST - kombu_priority
