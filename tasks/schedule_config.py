"""The ``schedules`` section of a config file: each entry a Schedule and its when, checked as the admin does.

```json
{"name": "daily-digest", "task_type": "digest.send", "payload": {"list": "team"},
 "crontab": {"minute": "0", "hour": "9", "timezone": "Europe/Berlin"}, "missed": "once"}
```

The when is one of ``interval`` (``{"every": 10, "period": "seconds"}``),
``crontab`` (celery's fields, each ``*`` unless given, and a time zone) or
``clocked`` (ISO 8601 with an offset). django-celery-beat's rows are shared:
an equal interval or crontab is reused, never duplicated.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule

from tasks.errors import ConfigError
from tasks.models import Schedule, TaskType

FIELDS = ("payload", "chat_id", "limit_key", "priority", "missed", "enabled")
WHENS = ("interval", "crontab", "clocked")
CRON_FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
PERIODS = tuple(choice for choice, _ in IntervalSchedule.PERIOD_CHOICES)


def _problems(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        return "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items())
    return " ".join(exc.messages)


def _checked(where: str, obj: Any, exclude: tuple[str, ...] = ()) -> Any:
    try:
        obj.full_clean(exclude=list(exclude) or None)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_problems(exc)}") from None
    return obj


def _interval(where: str, spec: Any) -> IntervalSchedule:
    if not isinstance(spec, dict) or set(spec) - {"every", "period"}:
        raise ConfigError(f"{where}: interval: must be an object {{\"every\": N, \"period\": ...}}")
    every, period = spec.get("every"), spec.get("period", "seconds")
    if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= 10**9:
        raise ConfigError(f"{where}: interval: every must be an integer 1..1000000000, not {every!r}")
    if period not in PERIODS:
        raise ConfigError(f"{where}: interval: period must be one of {', '.join(PERIODS)}, not {period!r}")
    found = IntervalSchedule.objects.filter(every=every, period=period).first()
    return found or _checked(where + ": interval", IntervalSchedule(every=every, period=period))


def _crontab(where: str, spec: Any) -> CrontabSchedule:
    if not isinstance(spec, dict) or set(spec) - {*CRON_FIELDS, "timezone"}:
        raise ConfigError(f"{where}: crontab: must be an object with {', '.join(CRON_FIELDS)}, timezone")
    fields = {f: spec.get(f, "*") for f in CRON_FIELDS}
    bad = [f for f, v in fields.items() if not isinstance(v, str)]
    if bad or not isinstance(spec.get("timezone", "UTC"), str):
        raise ConfigError(f"{where}: crontab: {', '.join(bad) or 'timezone'} must be text")
    try:
        row = CrontabSchedule(**fields, timezone=spec.get("timezone", "UTC"))  # the zone is read here
        row.full_clean()
    except ValidationError as exc:
        raise ConfigError(f"{where}: crontab: {_problems(exc)}") from None
    found = CrontabSchedule.objects.filter(**fields, timezone=row.timezone).first()
    return found or row


def _clocked(where: str, spec: Any) -> ClockedSchedule:
    try:
        at = datetime.fromisoformat(spec) if isinstance(spec, str) else None
    except ValueError:
        at = None
    if at is None or at.utcoffset() is None:
        raise ConfigError(f"{where}: clocked: must be an ISO 8601 time with an offset "
                          f"(2026-12-24T18:00:00+01:00), not {spec!r}")
    return ClockedSchedule.objects.filter(clocked_time=at).first() or ClockedSchedule(clocked_time=at)


def apply_schedules(entries: list[dict], check_keys: Callable[[str, dict, tuple[str, ...]], None]) -> int:
    """Upsert each entry (already checked for a name and storable text); raises ConfigError naming the bad one."""
    for i, entry in enumerate(entries):
        where = f"schedules[{i}] {entry['name']!r}"
        check_keys(where, entry, ("task_type", *FIELDS, *WHENS))
        whens = [w for w in WHENS if w in entry]
        if len(whens) != 1:
            raise ConfigError(f"{where}: exactly one of {', '.join(WHENS)} is required")
        obj = Schedule.objects.filter(name=entry["name"]).first() or Schedule(name=entry["name"])
        if "task_type" in entry or obj.pk is None:
            task_type = TaskType.objects.filter(name=entry.get("task_type")).first()
            if task_type is None:
                raise ConfigError(f"{where}: task_type {entry.get('task_type')!r} does not exist")
            obj.task_type = task_type
        for field in FIELDS:
            if field in entry:
                value = entry[field]
                if field in ("chat_id", "limit_key") and value is None:
                    value = ""
                if field in ("chat_id", "limit_key", "missed") and not isinstance(value, str):
                    raise ConfigError(f"{where}: {field}: must be text, not {value!r}")
                if field == "priority" and (isinstance(value, bool) or not isinstance(value, (int, type(None)))):
                    raise ConfigError(f"{where}: priority: must be an integer 0..9 or null, not {value!r}")
                if field == "enabled" and not isinstance(value, bool):
                    raise ConfigError(f"{where}: enabled: must be true or false, not {value!r}")
                setattr(obj, field, value)
        when = whens[0]
        row = {"interval": _interval, "crontab": _crontab, "clocked": _clocked}[when](where, entry[when])
        if row.pk is None:
            row.save()
        for other in WHENS:
            setattr(obj, other, row if other == when else None)
        _checked(where, obj, exclude=("periodic_task",))
        obj.save()
    return len(entries)


def export_schedules() -> list[dict]:
    out = []
    for s in Schedule.objects.select_related("task_type", "interval", "crontab", "clocked"):
        entry: dict[str, Any] = {"name": s.name, "task_type": s.task_type.name,
                                 **{f: getattr(s, f) for f in FIELDS}}
        if s.interval is not None:
            entry["interval"] = {"every": s.interval.every, "period": s.interval.period}
        elif s.crontab is not None:
            entry["crontab"] = {**{f: getattr(s.crontab, f) for f in CRON_FIELDS}, "timezone": str(s.crontab.timezone)}
        elif s.clocked is not None:
            entry["clocked"] = s.clocked.clocked_time.isoformat()
        out.append(entry)
    return out
