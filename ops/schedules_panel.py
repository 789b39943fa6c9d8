"""The dashboard's schedules: each one's next fire and how its last due time went."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.urls import reverse

from tasks.models import Schedule

#: Most schedules the panel lists (the admin's list has them all).
PANEL_ROWS = 20


def rows(now: datetime | None = None, limit: int = PANEL_ROWS) -> list[dict[str, Any]]:
    """The enabled schedules first, soonest next fire first; a paused one says so."""
    now = now or datetime.now(UTC)
    found = []
    for s in Schedule.objects.select_related("task_type", "interval", "crontab", "clocked")[:limit]:
        try:
            next_fire = s.next_fire(now)
        except ValueError as exc:  # a zone or definition this process cannot read: shown, not a 500
            next_fire, problem = None, str(exc)
        else:
            problem = ""
        found.append({
            "name": s.name, "type": s.task_type.name, "enabled": s.enabled,
            "when": str(s.interval or s.crontab or s.clocked or "-"), "missed": s.missed,
            "next_fire": next_fire, "last_due": s.last_due_at, "outcome": s.last_outcome or "-",
            "reason": s.last_reason or problem, "task_id": s.last_task_id,
            "fired": s.fired_count, "refused": s.refused_count, "skipped": s.skipped_count,
            "url": reverse("admin:tasks_schedule_change", args=[s.pk]),
        })
    far = datetime.max.replace(tzinfo=UTC)
    found.sort(key=lambda r: (not r["enabled"], r["next_fire"] or far, r["name"]))
    return found
