"""``Context``: what a handler knows about the task it runs (its second argument)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lanes.redis_client import get_redis
from tasks.history import check_progress, report_progress


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
    #: The task's record in Redis (where a cancel leaves its flag); '' outside a worker.
    _record: str = field(default="", repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """Whether someone cancelled this task while it runs (``tasks.cancel``); read from Redis each time.

        A handler checks it before an effect it can still avoid (``http.post``
        does, before sending). Redis not answering reads as not cancelled: the
        task goes on, as it would have without the cancel.
        """
        if not self._record:
            return False
        try:
            return bool(get_redis().hexists(self._record, "cx"))
        except Exception:  # noqa: BLE001 - see the docstring
            return False

    def progress(self, fraction: float, note: str | None = None) -> None:
        """Report how far the task has come (0..1, with a short note), shown by the API, the admin and Flower.

        Cheap: the value is kept in process and written beside the task at most
        twice a second (the last one always: ``tasks.history``). A bad value
        raises ``tasks.history.InvalidProgress`` (a ValueError) saying what is wrong.
        """
        check_progress(fraction, note)
        if self._record:  # outside a worker there is no task to report on
            report_progress(self.task_id, fraction, note)

    @property
    def remaining(self) -> float:
        """Seconds left for this attempt (its limit, or the task's deadline if sooner)."""
        return max(0.0, self.attempt_deadline - time.time())


class BatchItem(NamedTuple):
    """One item of a batched handler's call: ``for payload, ctx in items`` (docs/batching.md)."""

    payload: dict[str, Any]
    ctx: Context
