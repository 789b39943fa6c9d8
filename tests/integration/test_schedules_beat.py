"""Schedules fired by real ``celery beat`` processes (tasks.beat) into the real Redis: once per due time.

Each schedule's type sits on a lane of its own that no worker consumes, so the
lane's depth is the number of tasks admission let in, and each due time's
idempotency key (``sched:<id>:<due>``) names the one task made for it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.support.beat import Beat
from tests.support.helpers import define, lane_depth, unique, wait_until


@pytest.fixture
def start_beat(tmp_root):
    started: list[Beat] = []

    def start() -> Beat:
        beat = Beat(tmp_root / "logs").start()
        started.append(beat)
        return beat

    yield start
    for beat in started:
        beat.kill()


def _schedule(name: str, lane: str, *, every_s: int, missed: str = "once", **fields):
    from django_celery_beat.models import IntervalSchedule

    from tasks.models import Schedule

    define(name, lane=lane)
    interval, _ = IntervalSchedule.objects.get_or_create(every=every_s, period="seconds")
    return Schedule.objects.create(name=name, task_type_id=define(name, lane=lane).pk, payload={"n": 1},
                                   interval=interval, missed=missed, **fields)


def _fired_tasks(rc, schedule, dues) -> list[str | None]:
    from lanes import keys
    from tasks.schedules import fire_key

    found = []
    for due in dues:
        task = rc.hget(keys.idempotency(schedule.task_type.name, fire_key(schedule.pk, due)), "task")
        found.append(task.decode() if task else None)
    return found


def _grid(schedule, first: datetime, last: datetime) -> list[datetime]:
    from tasks.schedules import next_due

    defn, dues, moment = schedule.definition(), [first], first
    while (moment := next_due(defn, moment)) <= last:
        dues.append(moment)
    return dues


def test_two_beats_at_once_fire_every_due_time_exactly_once(rc, start_beat):
    name = unique("sch2")
    lane = unique("tsch")
    schedule = _schedule(name, lane, every_s=1)
    start_beat(), start_beat()
    wait_until(lambda: schedule.__class__.objects.get(pk=schedule.pk).fired_count >= 5, timeout=30,
               what="five fires")
    time.sleep(1.2)  # both beats keep going a while: a double fire would show now
    row = schedule.__class__.objects.get(pk=schedule.pk)
    first = schedule.definition().anchor + timedelta(seconds=1)
    dues = [d for d in _grid(schedule, first, row.last_due_at)]
    tasks = _fired_tasks(rc, schedule, dues)
    # The first due times may precede the beats' start (one catch-up fire covers them): from the first fired on.
    start = next((i for i, t in enumerate(tasks) if t), None)
    assert start is not None, f"no due time's key names a task: {dues}"
    fired = tasks[start:]
    assert None not in fired, f"due times never fired: {[d for d, t in zip(dues[start:], fired, strict=True) if not t]}"
    assert len(set(fired)) == len(fired)
    # Nothing admitted beyond one task per due time, though both beats dispatched each one.
    assert lane_depth(rc, lane) == len(fired)
    assert row.fired_count == len(fired) and row.refused_count == 0
    assert row.skipped_count == start  # the due times before the beats ran, jumped over by the first fire


def test_a_due_time_passed_while_beat_restarts_is_fired_after_it_once_even_if_sent_mid_fire(rc, start_beat):
    """Hourly schedules whose due time falls while beat is down: the restarted beat fires each, once.

    One of them the killed beat had sent but not recorded (a crash mid-fire):
    the restarted beat's dispatch is answered ``duplicate`` and records that task.
    (Hourly, so a restart's seconds, many under load, stay well inside one period.)
    """
    from tasks.dispatch import dispatch
    from tasks.models import Schedule
    from tasks.schedules import fire_key

    first = start_beat()
    lanes, rows = {}, {}
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    for case in ("plain", "mid-fire"):
        lanes[case] = unique("tsch")
        row = _schedule(unique(f"schr-{case}"), lanes[case], every_s=3600, missed="once")
        anchor = due - timedelta(hours=1)  # the first due time two seconds from now, beat down by then
        Schedule.objects.filter(pk=row.pk).update(anchor_at=anchor, since_at=anchor)
        rows[case] = row
    first.kill()
    wait_until(lambda: datetime.now(UTC) > due, timeout=10, what="the due time, beat down")
    assert all(Schedule.objects.get(pk=r.pk).last_due_at is None for r in rows.values())
    # The killed beat had sent this one's dispatch but not recorded it: admission has its task.
    sent = dispatch.delay(rows["mid-fire"].task_type.name, {"n": 1},
                          idempotency_key=fire_key(rows["mid-fire"].pk, due))
    assert sent.accepted and not sent.duplicate
    start_beat()
    wait_until(lambda: all(Schedule.objects.get(pk=r.pk).last_due_at == due for r in rows.values()), timeout=60,
               what="both due times recorded after the restart")
    plain, mid = (Schedule.objects.get(pk=r.pk) for r in rows.values())
    for row, case in ((plain, "plain"), (mid, "mid-fire")):
        assert (row.last_outcome, row.fired_count, row.skipped_count) == ("fired", 1, 0), case
        assert _fired_tasks(rc, row, [due]) == [row.last_task_id], case
        assert lane_depth(rc, lanes[case]) == 1, case  # fired once: none lost, none made twice
    assert mid.last_task_id == sent.task_id  # the crashed beat's task, not a second one


def test_after_a_gap_once_fires_one_catch_up_skip_fires_none_and_a_refused_fire_says_why(rc, start_beat):
    from lanes.models import Lane
    from tasks.models import Schedule

    now = datetime.now(UTC)
    anchor = now - timedelta(hours=5, minutes=10)  # hourly due times at now-4:10, ..., now-0:10
    rows = {}
    for policy in ("once", "skip", "refused"):
        lane = unique("tsch")
        row = _schedule(unique(f"schg-{policy}"), lane, every_s=3600, missed="skip" if policy == "skip" else "once")
        # Beat was down for four hours: the last due time decided was 4:10 ago.
        Schedule.objects.filter(pk=row.pk).update(anchor_at=anchor, since_at=anchor,
                                                  last_due_at=anchor + timedelta(hours=1))
        rows[policy] = (Schedule.objects.get(pk=row.pk), lane)
    Lane.objects.filter(name=rows["refused"][1]).update(accepting=False)
    start_beat()
    wait_until(lambda: all(Schedule.objects.get(pk=r.pk).last_outcome for r, _ in rows.values()), timeout=30,
               what="every schedule's tick")
    time.sleep(1.5)  # more ticks: a burst of catch-ups would show now
    latest = anchor + timedelta(hours=5)
    once, skip, refused = (Schedule.objects.get(pk=r.pk) for r, _ in rows.values())
    assert (once.last_outcome, once.fired_count, once.skipped_count) == ("fired", 1, 3)
    assert "catch-up" in once.last_reason and once.last_due_at == latest
    assert lane_depth(rc, rows["once"][1]) == 1
    assert (skip.last_outcome, skip.fired_count, skip.skipped_count) == ("skipped", 0, 4)
    assert "policy skip" in skip.last_reason and lane_depth(rc, rows["skip"][1]) == 0
    assert (refused.last_outcome, refused.refused_count, refused.fired_count) == ("refused", 1, 0)
    assert refused.last_reason.startswith("lane_closed")
    # Each waits for its next due time, an hour after the last.
    assert once.next_fire() == skip.next_fire() == latest + timedelta(hours=1)
