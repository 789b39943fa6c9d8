"""Alias of ``lanes.leases`` (running tasks' leases and settling, moved into the engine by issue 14)."""

from __future__ import annotations

from lanes.leases import hold, owner_id, owner_is_dead_here, release, settle, settle_now

__all__ = ["hold", "owner_id", "owner_is_dead_here", "release", "settle", "settle_now"]
