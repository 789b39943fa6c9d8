"""``Context``: what a handler knows about the task it runs (its second argument)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Context:
    """What a handler knows about the task it runs."""

    task_id: str
    type: str
    lane: str
    chat_id: str
    attempt: int
    deadline: float
    attempt_deadline: float
    idempotency_key: str
    metadata: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def remaining(self) -> float:
        """Seconds left for this attempt (its limit, or the task's deadline if sooner)."""
        return max(0.0, self.attempt_deadline - time.time())


class BatchItem(NamedTuple):
    """One item of a batched handler's call: ``for payload, ctx in items`` (docs/batching.md)."""

    payload: dict[str, Any]
    ctx: Context
