"""Beat's side of schedules: django-celery-beat's DatabaseScheduler, with platform schedules fired here.

``Scheduler`` (``CELERY_BEAT_SCHEDULER``) serves every PeriodicTask as
django-celery-beat does (the maintenance entries of ``CELERY_BEAT_SCHEDULE``
included), except those naming ``tasks.fire_schedule``: for them the due time
comes from the schedule's own grid (``tasks.schedules``), read afresh from the
database on each check rather than from this process's ``last_run_at``, and a
due fire is dispatched in this process through admission with the key
``sched:<id>:<due time>``. Two beats, or a beat restarted mid-fire, send the
same key for the same due time: admission admits one and answers the other
``duplicate``. Then one conditional update (``last_due_at`` before this due
time) records the outcome, so the counts move once per due time too.

``fire_schedule``, the Celery task of that name, does the same from a worker
for a beat run with django-celery-beat's stock scheduler.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from celery import schedules as celery_schedules
from celery import shared_task
from django.db.models import F, Q
from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry

from tasks.dispatch import dispatch
from tasks.models import FIRE_TASK, Schedule
from tasks.schedules import Decision, fire_key

logger = logging.getLogger(__name__)

#: Longest a platform schedule's entry sleeps between checks, in seconds (an edit wakes beat anyway).
MAX_CHECK_S = 60.0


def fire(schedule_id: int, now: datetime | None = None) -> Decision | None:
    """Decide the schedule's tick at ``now`` and carry it out; returns the decision (None: no such schedule)."""
    now = now or datetime.now(UTC)
    schedule = (Schedule.objects.select_related("task_type", "interval", "crontab", "clocked")
                .filter(pk=schedule_id).first())
    if schedule is None or not schedule.enabled or not schedule.kind():
        return None
    decision = schedule.decide(now)
    if decision.action == "wait" or decision.due is None:
        return decision
    due = decision.due
    if decision.action == "skip":
        _record(schedule, due, now, "skipped", skipped=decision.missed + 1,
                reason=f"late by {(now - due).total_seconds():.0f} s (policy skip)")
        return decision
    result = dispatch.delay(
        schedule.task_type.name, schedule.payload, chat_id=schedule.chat_id or None,
        priority=schedule.priority, limit_key=schedule.limit_key or None,
        idempotency_key=fire_key(schedule.pk, due),
        metadata={"schedule": schedule.name, "due": due.isoformat()},
    )
    note = f"catch-up of a gap ({decision.missed + 1} due times)" if decision.late else ""
    if result.accepted or (result.reason == "idempotency_conflict" and result.task_id):
        # Accepted, a duplicate (another beat, or this one before a restart, fired this due time)
        # or a conflict (it did, before the payload was edited): the due time is fired, once.
        _record(schedule, due, now, "fired", skipped=decision.missed, reason=note,
                task_id=result.task_id or "")
    else:
        detail = f"{result.reason}: {result.detail}" if result.detail else str(result.reason)
        _record(schedule, due, now, "refused", skipped=decision.missed, reason=detail[:500])
        logger.warning("schedule_refused schedule=%s due=%s reason=%s", schedule.name, due.isoformat(), detail)
    return decision


def _record(schedule: Schedule, due: datetime, now: datetime, outcome: str, *, skipped: int, reason: str,
            task_id: str = "") -> bool:
    """Record the due time's outcome unless a later or equal one is recorded already; whether it was."""
    counts: dict[str, Any] = {"skipped_count": F("skipped_count") + skipped}
    if outcome == "fired":
        counts["fired_count"] = F("fired_count") + 1
    elif outcome == "refused":
        counts["refused_count"] = F("refused_count") + 1
    changed = (Schedule.objects.filter(Q(last_due_at__isnull=True) | Q(last_due_at__lt=due), pk=schedule.pk)
               .update(last_due_at=due, last_fired_at=now, last_outcome=outcome, last_reason=reason,
                       last_task_id=task_id, **counts))
    return bool(changed)


@shared_task(name=FIRE_TASK, ignore_result=True)
def fire_schedule(schedule_id: int) -> None:
    """A stock DatabaseScheduler's beat sends this: fired from the worker, keyed the same way."""
    fire(schedule_id)


class Entry(ModelEntry):
    """A PeriodicTask; a platform schedule's is due by its own grid and state, not ``last_run_at``."""

    def platform_schedule_id(self) -> int | None:
        if self.task != FIRE_TASK:
            return None
        value = self.kwargs.get("schedule_id") if isinstance(self.kwargs, dict) else None
        return value if isinstance(value, int) else None

    def is_due(self) -> celery_schedules.schedstate:
        schedule_id = self.platform_schedule_id()
        if schedule_id is None:
            return super().is_due()
        now = datetime.now(UTC)
        schedule = (Schedule.objects.select_related("interval", "crontab", "clocked")
                    .filter(pk=schedule_id, enabled=True).first())
        if schedule is None or not schedule.kind():
            return celery_schedules.schedstate(False, MAX_CHECK_S)
        decision = schedule.decide(now)
        if decision.action != "wait":
            return celery_schedules.schedstate(True, _seconds_until(decision.next_due, now))
        return celery_schedules.schedstate(False, _seconds_until(decision.next_due, now))


def _seconds_until(moment: datetime | None, now: datetime) -> float:
    if moment is None:
        return MAX_CHECK_S
    return min(max((moment - now).total_seconds(), 0.0), MAX_CHECK_S)


class Scheduler(DatabaseScheduler):
    """django-celery-beat's DatabaseScheduler; platform schedules are fired here, through admission."""

    Entry = Entry

    def enabled_models_qs(self) -> Any:
        """Every platform schedule, besides what the stock scheduler loads.

        The stock one leaves out a crontab whose hour is more than two hours
        away, so a beat back at 13:00 would not see the 09:00 it missed.
        """
        return super().enabled_models_qs() | self.Model.objects.enabled().filter(task=FIRE_TASK)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        schedule_id = entry.platform_schedule_id() if isinstance(entry, Entry) else None
        if schedule_id is None:
            super().apply_entry(entry, producer=producer)
            return
        try:
            decision = fire(schedule_id)
        except Exception:  # one schedule's failure (Redis or the database down) must not stop beat
            logger.exception("schedule_fire_failed schedule_id=%s", schedule_id)
            return
        if decision is not None and decision.due is not None:
            logger.info("schedule_tick schedule_id=%s action=%s due=%s", schedule_id, decision.action,
                        decision.due.isoformat())
