"""Dead letters: recording them, and the operator's requeue and discard."""

from __future__ import annotations

import datetime as dt
import logging
import traceback as tb
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_celery_results.models import TaskResult

from tasks import owners
from tasks.dispatch import DispatchResult, admit
from tasks.models import DeadLetter

logger = logging.getLogger(__name__)


def record(
    *,
    task_id: str,
    task_type: str,
    lane: str,
    reason: str,
    payload: Any = None,
    chat_id: str = "",
    idempotency_key: str = "",
    metadata: dict | None = None,
    priority: int = 5,
    attempts: int = 0,
    dispatched_at: float | None = None,
    exc: BaseException | None = None,
    message: str = "",
) -> DeadLetter:
    """Write (or keep, on a redelivery) the one dead-letter row of ``task_id``."""
    error_class = f"{type(exc).__module__}.{type(exc).__qualname__}" if exc is not None else ""
    text = message or (str(exc) if exc is not None else "")
    trace = "".join(tb.format_exception(exc)) if exc is not None else ""
    row, created = DeadLetter.objects.get_or_create(
        task_id=task_id,
        defaults={
            "task_type": task_type[:100], "lane": lane[:64], "chat_id": chat_id[:128],
            "payload": payload, "idempotency_key": idempotency_key[:200], "metadata": metadata or {},
            "priority": priority, "reason": reason, "error_class": error_class[:200],
            "error_message": text[:10000], "traceback": trace[:50000], "attempts": attempts,
            "dispatched_at": (dt.datetime.fromtimestamp(dispatched_at, tz=dt.UTC) if dispatched_at else None),
        },
    )
    if created:
        logger.warning("dead_letter task=%s type=%s reason=%s attempts=%s", task_id, task_type, reason, attempts)
    return row


class RequeueError(Exception):
    """The dead letter cannot be requeued; the message says why."""


#: Namespace of the task ids requeues derive from their dead letter (uuid5).
REQUEUE_NAMESPACE = uuid.UUID("7d1c8a52-58f5-4d0e-9a51-6f0b1c2de0a7")


def requeue_task_id(row: DeadLetter) -> str:
    """The id of the task a requeue of ``row`` makes: the same for every attempt at requeuing that row.

    A requeue whose outcome was lost (Redis timed out after admitting, or the
    row's update failed to commit) leaves the row ``dead``; the next click
    derives the same id, and admission answers with the task already stored
    instead of making a second one. A row is requeued at most once (its status
    then changes), so the dead letter's own task id is the whole key. The new
    id keeps the old one's owner mark (``tasks.owners``): a caller's requeued
    task is still its own.
    """
    return owners.mark_of(row.task_id) + str(uuid.uuid5(REQUEUE_NAMESPACE, f"requeue:{row.task_id}"))


def _already_finished(task_id: str) -> bool:
    """Whether the task ``task_id`` ran to an end: its result row or its own dead letter is stored.

    Its Redis record is removed only after its result row is stored (forget.lua),
    so a task of that id is either still in Redis (admission sees it) or found here.
    """
    return (TaskResult.objects.filter(task_id=task_id).exists()
            or DeadLetter.objects.filter(task_id=task_id).exists())


def requeue(row: DeadLetter, actor: str) -> str:
    """Dispatch a fresh task from ``row`` (new deadline), link it and mark the row requeued.

    Idempotent per row: repeating a requeue whose outcome was lost links the
    task the first attempt made (see :func:`requeue_task_id`), never a second.
    """
    with transaction.atomic():
        locked = DeadLetter.objects.select_for_update().get(pk=row.pk)
        if locked.status != DeadLetter.Status.DEAD:
            raise RequeueError(f"dead letter {locked.task_id} is already {locked.status}")
        if not isinstance(locked.payload, dict):
            raise RequeueError(f"dead letter {locked.task_id} has no valid payload to requeue")
        new_id = requeue_task_id(locked)
        if _already_finished(new_id):
            result = DispatchResult(True, new_id, locked.lane, locked.priority, duplicate=True)
        else:
            result = admit(
                locked.task_type, locked.payload, chat_id=locked.chat_id or None, priority=locked.priority,
                idempotency_key=locked.idempotency_key or None, metadata=locked.metadata or None,
                _replace_idempotency=True, _task_id=new_id,
            )
        if not result.accepted:
            raise RequeueError(f"dispatch refused the requeue of {locked.task_id}: {result.reason} ({result.detail})")
        locked.status = DeadLetter.Status.REQUEUED
        locked.requeued_task_id = result.task_id
        locked.resolved_at = timezone.now()
        locked.resolved_by = actor[:150]
        locked.save(update_fields=["status", "requeued_task_id", "resolved_at", "resolved_by"])
    logger.info("dead_letter_requeued task=%s new_task=%s by=%s", row.task_id, result.task_id, actor)
    return locked.requeued_task_id


def discard(row: DeadLetter, actor: str) -> None:
    updated = DeadLetter.objects.filter(pk=row.pk, status=DeadLetter.Status.DEAD).update(
        status=DeadLetter.Status.DISCARDED, resolved_at=timezone.now(), resolved_by=actor[:150]
    )
    if not updated:
        raise RequeueError(f"dead letter {row.task_id} is not pending")
    logger.info("dead_letter_discarded task=%s by=%s", row.task_id, actor)


def purge_resolved(retention_days: int | None = None, batch_size: int = 500) -> int:
    """Delete resolved rows older than the retention, ``batch_size`` at a time."""
    days = settings.DISPATCH_DEADLETTER_RETENTION_DAYS if retention_days is None else retention_days
    cutoff = timezone.now() - dt.timedelta(days=days)
    total = 0
    while True:
        ids = list(
            DeadLetter.objects.exclude(status=DeadLetter.Status.DEAD)
            .filter(resolved_at__lt=cutoff).values_list("pk", flat=True)[:batch_size]
        )
        if not ids:
            return total
        total += DeadLetter.objects.filter(pk__in=ids).delete()[0]
