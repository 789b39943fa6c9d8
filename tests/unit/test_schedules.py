"""Due times, the missed-fire policy and fire keys of tasks.schedules (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks import schedules
from tasks.schedules import Cron, Interval, OneOff, decide, fire_key, latest_due, next_due

T0 = datetime(2026, 12, 2, 0, 0, tzinfo=UTC)
ALL_DAYS = dict(days_of_week=frozenset(range(7)), days_of_month=frozenset(range(1, 32)),
                months=frozenset(range(1, 13)))
BERLIN_9 = Cron(minutes=frozenset({0}), hours=frozenset({9}), zone="Europe/Berlin", **ALL_DAYS)


def every(seconds: float, anchor: datetime = T0) -> Interval:
    return Interval(every_us=int(seconds * 1_000_000), anchor=anchor)


def test_an_interval_is_a_grid_from_its_anchor_whatever_the_moment_asked():
    defn = every(10)
    assert latest_due(defn, T0 + timedelta(seconds=9.9)) is None
    assert latest_due(defn, T0 + timedelta(seconds=10)) == T0 + timedelta(seconds=10)
    assert latest_due(defn, T0 + timedelta(seconds=25.3)) == T0 + timedelta(seconds=20)
    assert next_due(defn, T0 + timedelta(seconds=20)) == T0 + timedelta(seconds=30)
    assert next_due(defn, T0 - timedelta(days=1)) == T0 + timedelta(seconds=10)


def test_a_daily_crontab_in_berlin_is_at_nine_local_in_winter_and_in_summer():
    winter = latest_due(BERLIN_9, datetime(2026, 12, 2, 12, tzinfo=UTC))
    summer = latest_due(BERLIN_9, datetime(2026, 7, 2, 12, tzinfo=UTC))
    assert winter == datetime(2026, 12, 2, 8, tzinfo=UTC)  # CET, +01:00
    assert summer == datetime(2026, 7, 2, 7, tzinfo=UTC)  # CEST, +02:00
    assert next_due(BERLIN_9, winter) == datetime(2026, 12, 3, 8, tzinfo=UTC)
    assert winter.astimezone(ZoneInfo("Europe/Berlin")).hour == 9
    # Before nine local today: yesterday's.
    assert latest_due(BERLIN_9, datetime(2026, 12, 2, 7, 59, tzinfo=UTC)) == datetime(2026, 12, 1, 8, tzinfo=UTC)


def test_a_crontab_needs_every_field_celerys_way():
    mondays = Cron(minutes=frozenset({30}), hours=frozenset({6}), days_of_week=frozenset({1}),
                   days_of_month=frozenset(range(1, 32)), months=frozenset(range(1, 13)))
    due = next_due(mondays, datetime(2026, 12, 2, tzinfo=UTC))  # a Wednesday
    assert due == datetime(2026, 12, 7, 6, 30, tzinfo=UTC) and due.isoweekday() == 1


def test_a_one_off_is_due_once():
    at = T0 + timedelta(hours=1)
    assert latest_due(OneOff(at), T0) is None and next_due(OneOff(at), T0) == at
    assert latest_due(OneOff(at), at + timedelta(days=3)) == at and next_due(OneOff(at), at) is None


def test_a_tick_fires_the_latest_due_time_and_counts_those_jumped_over():
    defn = every(1)
    d = decide(defn, T0 + timedelta(seconds=5.2), last_due=T0 + timedelta(seconds=2), since=T0)
    assert (d.action, d.due, d.missed, d.late) == ("fire", T0 + timedelta(seconds=5), 2, False)
    assert d.next_due == T0 + timedelta(seconds=6)
    # Already decided: wait for the next.
    again = decide(defn, T0 + timedelta(seconds=5.7), last_due=T0 + timedelta(seconds=5), since=T0)
    assert again.action == "wait" and again.next_due == T0 + timedelta(seconds=6)


def test_a_gap_past_the_grace_fires_once_or_is_skipped_by_policy_never_a_burst():
    hourly = every(3600)
    back = T0 + timedelta(hours=5, minutes=10)  # beat down from 1:00 to 5:10
    once = decide(hourly, back, last_due=T0 + timedelta(hours=1), since=T0, policy="once")
    skip = decide(hourly, back, last_due=T0 + timedelta(hours=1), since=T0, policy="skip")
    assert (once.action, once.due, once.late, once.missed) == ("fire", T0 + timedelta(hours=5), True, 3)
    assert (skip.action, skip.due, skip.late) == ("skip", T0 + timedelta(hours=5), True)
    # After the catch-up, nothing until six.
    after = decide(hourly, back + timedelta(seconds=1), last_due=once.due, since=T0, policy="once")
    assert after.action == "wait" and after.next_due == T0 + timedelta(hours=6)


def test_due_times_before_the_schedule_existed_are_not_its_own():
    created = T0 + timedelta(hours=10)  # 10:00 UTC, after today's 09:00 Berlin (08:00 UTC)
    d = decide(BERLIN_9, created + timedelta(minutes=5), last_due=None, since=created)
    assert d.action == "wait" and d.next_due == datetime(2026, 12, 3, 8, tzinfo=UTC)


def test_the_fire_key_names_the_schedule_and_the_due_instant_in_utc():
    berlin = datetime(2026, 12, 2, 9, tzinfo=ZoneInfo("Europe/Berlin"))
    assert fire_key(7, berlin) == "sched:7:2026-12-02T08:00:00+00:00"
    assert fire_key(7, berlin) == fire_key(7, berlin.astimezone(UTC))
    with pytest.raises(ValueError, match="aware"):
        fire_key(7, datetime(2026, 12, 2, 9))
    with pytest.raises(ValueError, match="policy"):
        decide(every(1), T0, last_due=None, since=None, policy="burst")  # type: ignore[arg-type]


@given(st.integers(1, 7200), st.integers(0, 10**7), st.integers(0, 10**6))
def test_two_ticks_anywhere_in_one_period_agree_on_the_due_time(every_s, offset_s, jitter_us):
    """What makes two beats send one key: the due time depends on the moment only through its period."""
    defn = every(every_s)
    first = T0 + timedelta(seconds=offset_s)
    later = first + timedelta(microseconds=jitter_us)
    a, b = latest_due(defn, first), latest_due(defn, later)
    if a is not None and b is not None and next_due(defn, a) > later:
        assert a == b
    for due in (a, b):
        if due is not None:
            assert (due - T0) % timedelta(seconds=every_s) == timedelta(0)


@given(st.integers(1, 3600), st.integers(0, 86400 * 3), st.integers(0, 86400 * 3))
def test_the_missed_count_matches_the_grid(every_s, start_s, span_s):
    defn = every(every_s)
    start, end = T0 + timedelta(seconds=start_s), T0 + timedelta(seconds=start_s + span_s)
    brute, moment = 0, start
    while brute <= schedules.MISSED_COUNT_CAP:
        moment = next_due(defn, moment)
        if moment >= end:
            break
        brute += 1
    assert schedules.count_between(defn, start, end) == min(brute, schedules.MISSED_COUNT_CAP)
