"""When a schedule is due, and what a tick does about it: pure, no Django, Redis or Celery.

Due times are a grid fixed by the schedule's definition alone (an interval's
anchor, a crontab in its zone, a one-off's instant), never by when a beat last
woke: two beats, or a beat restarted mid-fire, compute the same due time and so
the same idempotency key (``fire_key``), and admission lets one through.

A tick fires at most one due time per schedule, the latest one passed; those it
jumped over are counted as missed. A latest due time older than its grace is
late: the schedule's policy then fires it (``once``: one catch-up) or records it
skipped (``skip``). A gap never becomes a burst.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

#: The missed-fire policies: one catch-up fire for a gap, or none.
POLICIES = ("once", "skip")
Policy = Literal["once", "skip"]

#: Longest a due time may wait for its fire and still count as on time, in seconds
#: (shorter for a schedule whose period is under twice this: half its period).
MAX_GRACE_S = 60.0

#: Days a crontab is searched for its previous or next match (celery's crontab
#: needs day of month AND day of week to match: 29 February on a Monday recurs in 28 years).
CRON_SEARCH_DAYS = 366 * 29

#: Missed due times are counted up to this many (a minutely crontab down for a year stops here).
MISSED_COUNT_CAP = 10_000


@dataclass(frozen=True)
class Interval:
    """Every ``every_us`` microseconds after ``anchor`` (the first due time is one period after it)."""

    every_us: int
    anchor: datetime


@dataclass(frozen=True)
class Cron:
    """Celery's crontab, expanded: a minute matches when every field holds its value (Sunday is day 0)."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_week: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    zone: str = "UTC"


@dataclass(frozen=True)
class OneOff:
    """Once, at ``at``."""

    at: datetime


Definition = Interval | Cron | OneOff


@dataclass(frozen=True)
class Decision:
    """What one tick does: ``fire`` or ``skip`` ``due``, or ``wait``; then sleep until ``next_due``."""

    action: Literal["fire", "skip", "wait"]
    due: datetime | None
    next_due: datetime | None
    #: Due times passed before ``due`` that no tick took (jumped over; capped at MISSED_COUNT_CAP).
    missed: int = 0
    #: ``due`` is older than its grace (a catch-up fire, or the one skipped).
    late: bool = False


def _aware(moment: datetime, what: str) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, not {moment!r}")
    return moment.astimezone(UTC)


def fire_key(schedule_id: int, due: datetime) -> str:
    """The idempotency key of a schedule's fire at ``due``: the same in every beat process."""
    return f"sched:{schedule_id}:{_aware(due, 'due').isoformat()}"


# --- due times -------------------------------------------------------------------


def latest_due(defn: Definition, now: datetime) -> datetime | None:
    """The last due time at or before ``now`` (None if there is none yet)."""
    now = _aware(now, "now")
    if isinstance(defn, Interval):
        anchor = _aware(defn.anchor, "anchor")
        periods = (now - anchor) // timedelta(microseconds=defn.every_us)
        return anchor + periods * timedelta(microseconds=defn.every_us) if periods >= 1 else None
    if isinstance(defn, OneOff):
        at = _aware(defn.at, "at")
        return at if at <= now else None
    return _cron_search(defn, now, forward=False)


def next_due(defn: Definition, after: datetime) -> datetime | None:
    """The first due time strictly after ``after`` (None if there is none)."""
    after = _aware(after, "after")
    if isinstance(defn, Interval):
        anchor = _aware(defn.anchor, "anchor")
        step = timedelta(microseconds=defn.every_us)
        periods = max((after - anchor) // step + 1, 1)
        return anchor + periods * step
    if isinstance(defn, OneOff):
        at = _aware(defn.at, "at")
        return at if at > after else None
    return _cron_search(defn, after, forward=True)


def _cron_search(cron: Cron, moment: datetime, *, forward: bool) -> datetime | None:
    """The crontab's match nearest ``moment``: the first after it, or the last at or before it.

    Matches are wall-clock minutes in the crontab's zone; a minute that does not
    exist (a DST gap) is taken at the UTC offset before the gap, one that occurs
    twice (the hour repeated in autumn) once, at its first occurrence.
    """
    zone = ZoneInfo(cron.zone)
    local_day = moment.astimezone(zone).date()
    clock = sorted((h, m) for h in cron.hours for m in cron.minutes)
    if not forward:
        clock.reverse()
    step = timedelta(days=1 if forward else -1)
    for offset in range(CRON_SEARCH_DAYS):
        day = local_day + offset * step
        if not _day_matches(cron, day):
            continue
        for hour, minute in clock:
            candidate = datetime.combine(day, time(hour, minute), tzinfo=zone).astimezone(UTC)
            if (candidate > moment) if forward else (candidate <= moment):
                return candidate
    return None


def _day_matches(cron: Cron, day: date) -> bool:
    return day.month in cron.months and day.day in cron.days_of_month and day.isoweekday() % 7 in cron.days_of_week


def count_between(defn: Definition, start: datetime, end: datetime) -> int:
    """How many due times lie strictly between ``start`` and ``end`` (capped at MISSED_COUNT_CAP)."""
    start, end = _aware(start, "start"), _aware(end, "end")
    if end <= start:
        return 0
    if isinstance(defn, Interval):
        first = next_due(defn, start)
        assert first is not None
        if first >= end:
            return 0
        step = timedelta(microseconds=defn.every_us)
        return min(((end - first) - timedelta(microseconds=1)) // step + 1, MISSED_COUNT_CAP)
    count, moment = 0, start
    while count < MISSED_COUNT_CAP:
        nxt = next_due(defn, moment)
        if nxt is None or nxt >= end:
            break
        count, moment = count + 1, nxt
    return count


def grace_s(defn: Definition, due: datetime) -> float:
    """Seconds after ``due`` its fire still counts as on time: MAX_GRACE_S, or half the period if shorter."""
    following = next_due(defn, due)
    if following is None:
        return MAX_GRACE_S
    return min(MAX_GRACE_S, (following - due).total_seconds() / 2)


# --- a tick ---------------------------------------------------------------------------


def decide(defn: Definition, now: datetime, *, last_due: datetime | None, since: datetime | None,
           policy: Policy = "once") -> Decision:
    """What a tick at ``now`` does for a schedule whose last decided due time is ``last_due``.

    ``since``: due times at or before it are not the schedule's (it was created,
    or resumed, then); None counts every one (a one-off set in the past fires).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    now = _aware(now, "now")
    floor = max((m for m in (last_due, since) if m is not None), default=None)
    latest = latest_due(defn, now)
    following = next_due(defn, now)
    if latest is None or (floor is not None and latest <= floor):
        return Decision("wait", None, following)
    missed = count_between(defn, floor, latest) if floor is not None else 0
    late = (now - latest).total_seconds() > grace_s(defn, latest)
    action: Literal["fire", "skip"] = "skip" if late and policy == "skip" else "fire"
    return Decision(action, latest, following, missed=missed, late=late)
