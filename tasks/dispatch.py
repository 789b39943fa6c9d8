"""``dispatch``: admission in the caller, one Redis call, and a result at once.

``dispatch.delay(type, payload, chat_id=..., ...)`` never raises for bad input
or a full queue: it returns a ``DispatchResult`` whose ``reason`` says why it
was not accepted. Services that do not import this code send the same call by
name (``app.send_task("tasks.dispatch", ...)``); a worker on the ``ingress``
queue runs the same admission for them. ``dispatch_many(type, items)``
(``tasks.bulk``) admits many items of one type, one round trip per chunk; a
single dispatch takes the same path, as a chunk of one.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from celery import Task, shared_task

from tasks import cancel as cancelling
from tasks.admission import (  # noqa: F401  (DispatchResult, payload_digest: imported from here by callers)
    DISPATCH_OPTIONS,
    DispatchResult,
    payload_digest,
)
from tasks.bulk import admit_one, dispatch_many, new_task_ids  # noqa: F401  (dispatch_many: importable beside dispatch)

logger = logging.getLogger(__name__)


def admit(
    task_type: str,
    payload: Any,
    *,
    chat_id: str | None = None,
    priority: int | None = None,
    idempotency_key: str | None = None,
    timeout: float | None = None,
    metadata: dict | None = None,
    limit_key: str | None = None,
    countdown: float | None = None,
    eta: datetime | str | None = None,
    retry_policy: str | None = None,
    dedupe_key: str | None = None,
    _replace_idempotency: bool = False,
    _task_id: str | None = None,
    _lane_share: int = 100,
) -> DispatchResult:
    """Validate, admit and publish one task; see the module docstring.

    ``countdown`` (seconds) or ``eta`` (an aware datetime, or ISO 8601 text with
    an offset) sends it for later (``tasks.schedule``); ``retry_policy`` names the
    RetryPolicy its failed attempts follow instead of its type's. ``dedupe_key``: the key a
    throttled or debounced type goes by instead of the idempotency key (``tasks.dedupe``).

    ``_task_id`` (a dead letter's requeue) fixes the new task's id: with
    ``_replace_idempotency`` a task of that id already stored answers ``dup``.
    ``_lane_share`` (the HTTP API's, per token): the percentage of the lane's capacity
    that tasks marked with the caller's id may hold; past it, ``caller_quota``.
    """
    # Only the options given: ``prepare`` defaults each to None, and a plain call then passes none of
    # nine keywords through ``prepare(**options)`` (matched by name one by one, with the dict built first).
    options: dict[str, Any] = {}
    if chat_id is not None:
        options["chat_id"] = chat_id
    if priority is not None:
        options["priority"] = priority
    if idempotency_key is not None:
        options["idempotency_key"] = idempotency_key
    if timeout is not None:
        options["timeout"] = timeout
    if metadata is not None:
        options["metadata"] = metadata
    if limit_key is not None:
        options["limit_key"] = limit_key
    if countdown is not None:
        options["countdown"] = countdown
    if eta is not None:
        options["eta"] = eta
    if retry_policy is not None:
        options["retry_policy"] = retry_policy
    if dedupe_key is not None:
        options["dedupe_key"] = dedupe_key
    return admit_one(task_type, payload, options, task_id=_task_id or new_task_ids(1)[0],
                     replace_idempotency=_replace_idempotency, lane_share=_lane_share)


class DispatchTask(Task):
    """``delay``/``apply_async`` run admission here, in the caller, instead of publishing."""

    def delay(self, *args: Any, **kwargs: Any) -> DispatchResult:
        return admit(*args, **kwargs)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> DispatchResult:
        """As Celery's: ``countdown`` / ``eta`` given as options send the task for later, as in ``kwargs``."""
        kwargs = dict(kwargs or {})
        for name in ("countdown", "eta"):
            if options.get(name) is not None:
                kwargs.setdefault(name, options[name])
        return admit(*(args or ()), **kwargs)

    def cancel(self, task_id: Any, reason: Any = "", *, by: Any = "", chat_id: Any = None) -> cancelling.CancelResult:
        """Cancel a task by id: removed if it waits, told if it runs; answers what it found, never raises.

        ``chat_id``: the task's chat if known (one step; without it a chat task's record is searched for).
        """
        return cancelling.cancel_task(task_id, reason, by=by, chat_id=chat_id)

    def cancel_chat(self, chat_id: Any, reason: Any = "", *, by: Any = "") -> list[cancelling.CancelResult]:
        """Cancel everything queued for a chat (its running head is told)."""
        return cancelling.cancel_chat(chat_id, reason, by=by)

    def cancel_key(self, task_type: Any, idempotency_key: Any, reason: Any = "", *,
                   by: Any = "") -> cancelling.CancelResult:
        """Cancel the task a ``(task_type, idempotency_key)`` names."""
        return cancelling.cancel_key(task_type, idempotency_key, reason, by=by)


#: ``from tasks.dispatch import cancel_chat`` (the same as ``dispatch.cancel_chat``).
cancel_chat = cancelling.cancel_chat
cancel_key = cancelling.cancel_key


@shared_task(base=DispatchTask, name="tasks.dispatch", typing=False)
def dispatch(task_type: Any = None, payload: Any = None, **options: Any) -> dict[str, Any]:
    """Run by an ``ingress`` worker for callers that send ``tasks.dispatch`` by name."""
    unknown = sorted(set(options) - DISPATCH_OPTIONS)
    if unknown:
        return DispatchResult(False, reason="invalid_payload", detail=f"unknown dispatch options: {unknown}").as_dict()
    return admit(task_type, payload, **options).as_dict()
