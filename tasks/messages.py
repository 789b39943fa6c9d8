"""Alias of ``lanes.messages`` (the Celery message builder, moved into the engine by issue 14)."""

from __future__ import annotations

from lanes.messages import HARD_LIMIT_GRACE_S, Envelope, build_message

__all__ = ["HARD_LIMIT_GRACE_S", "Envelope", "build_message"]
