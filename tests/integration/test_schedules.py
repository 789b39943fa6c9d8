"""Schedules through their doors: the admin form, config files, the derived PeriodicTask, the dashboard panel."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from tasks import beat
from tasks.config_io import apply_config, export_config
from tasks.errors import ConfigError
from tasks.models import FIRE_TASK, Schedule
from tests.integration.test_config_io import config
from tests.support.helpers import define, unique


@pytest.fixture
def client() -> Client:
    user = get_user_model().objects.create_superuser(unique("sch"), "s@x", "pw-sched-12345")
    c = Client()
    c.force_login(user)
    return c


def _with_schedules(prefix: str, *schedules: dict) -> dict:
    data = config(prefix)
    data["schedules"] = [{"task_type": f"{prefix}.echo", **s} for s in schedules]
    return data


def test_schedules_round_trip_through_config_files():
    prefix = unique("cfs")
    digest = {"name": f"{prefix}-digest", "payload": {"list": "team"}, "missed": "skip",
              "crontab": {"minute": "0", "hour": "9", "timezone": "Europe/Berlin"}}
    data = _with_schedules(prefix, digest,
                           {"name": f"{prefix}-tick", "interval": {"every": 10, "period": "seconds"},
                            "priority": 7, "chat_id": "c1", "enabled": False},
                           {"name": f"{prefix}-once", "clocked": "2031-12-24T18:00:00+01:00"})
    assert apply_config(data)["schedules"] == 3
    mine = [s for s in export_config()["schedules"] if s["name"].startswith(prefix)]
    by_name = {s["name"]: s for s in mine}
    assert by_name[f"{prefix}-digest"]["crontab"] == {"minute": "0", "hour": "9", "day_of_week": "*",
                                                     "day_of_month": "*", "month_of_year": "*",
                                                     "timezone": "Europe/Berlin"}
    assert by_name[f"{prefix}-tick"]["enabled"] is False and by_name[f"{prefix}-tick"]["priority"] == 7
    assert datetime.fromisoformat(by_name[f"{prefix}-once"]["clocked"]) == datetime(2031, 12, 24, 17, tzinfo=UTC)
    # What export wrote applies again to the same thing (an upsert, no second row of anything).
    intervals = IntervalSchedule.objects.count()
    apply_config({**config(prefix), "schedules": mine})
    assert [s for s in export_config()["schedules"] if s["name"].startswith(prefix)] == mine
    assert IntervalSchedule.objects.count() == intervals
    # Each has its PeriodicTask for beat, paused with it.
    task = Schedule.objects.get(name=f"{prefix}-tick").periodic_task
    assert (task.task, task.enabled, task.interval.every) == (FIRE_TASK, False, 10)
    assert PeriodicTask.objects.get(name=f"schedule:{prefix}-once").one_off


@pytest.mark.parametrize("entry, named", [
    ({"task_type": "no.such.type", "interval": {"every": 1}}, "task_type 'no.such.type' does not exist"),
    ({"payload": [1, 2], "interval": {"every": 1}}, "payload: Payload must be a JSON object, not list."),
    ({"interval": {"every": 1}, "crontab": {"hour": "9"}}, "exactly one of interval, crontab, clocked"),
    ({}, "exactly one of interval, crontab, clocked"),
    ({"crontab": {"hour": "25"}}, "crontab: hour:"),
    ({"crontab": {"timezone": "Mars/Olympus"}}, "crontab: Invalid timezone 'Mars/Olympus'"),
    ({"interval": {"every": 0}}, "interval: every must be an integer"),
    ({"clocked": "2031-12-24T18:00:00"}, "clocked: must be an ISO 8601 time with an offset"),
    ({"interval": {"every": 5}, "missed": "burst"}, "missed:"),
    ({"interval": {"every": 5}, "priority": 12}, "priority: Priority must be 0..9"),
    ({"interval": {"every": 5}, "when": "daily"}, "unknown field(s) when"),
])
def test_a_bad_schedule_entry_is_named_and_nothing_is_written(entry, named):
    prefix = unique("cfb")
    with pytest.raises(ConfigError, match=re.escape(named)) as caught:
        apply_config(_with_schedules(prefix, {"name": f"{prefix}-s", **entry}))
    assert f"schedules[0] '{prefix}-s'" in str(caught.value)
    assert not Schedule.objects.filter(name=f"{prefix}-s").exists()
    assert not PeriodicTask.objects.filter(name=f"schedule:{prefix}-s").exists()


def _form(tt, interval, **fields) -> dict:
    return {"name": unique("adm"), "task_type": tt.pk, "payload": '{"to": "team"}', "chat_id": "", "limit_key": "",
            "priority": "", "interval": interval.pk, "crontab": "", "clocked": "", "missed": "once",
            "enabled": "on", **fields}


@pytest.mark.parametrize("payload, message", [
    ("[1, 2]", "Payload must be a JSON object ({...}), not an array."),
    ("{not json", "Payload is not valid JSON: {not json"),
    ('"text"', "Payload must be a JSON object ({...}), not a string."),
])
def test_the_admin_refuses_a_payload_that_is_not_a_json_object(client, payload, message):
    tt = define(unique("adm"), lane="t-sched")
    interval, _ = IntervalSchedule.objects.get_or_create(every=30, period="seconds")
    data = _form(tt, interval, payload=payload)
    response = client.post("/admin/tasks/schedule/add/", data)
    assert response.status_code == 200
    assert message in unescape(response.content.decode())
    assert not Schedule.objects.filter(name=data["name"]).exists()


def test_the_admin_adds_pauses_and_deletes_a_schedule_and_its_periodic_task(client):
    tt = define(unique("adm"), lane="t-sched", chat_scoped=True)
    interval, _ = IntervalSchedule.objects.get_or_create(every=30, period="seconds")
    data = _form(tt, interval)
    refused = client.post("/admin/tasks/schedule/add/", data)
    assert "is chat-scoped: a chat id is required" in unescape(refused.content.decode())
    both = client.post("/admin/tasks/schedule/add/", {**data, "chat_id": "c1", "clocked": _clock().pk})
    assert "Set exactly one of interval, crontab and one-off." in unescape(both.content.decode())
    assert client.post("/admin/tasks/schedule/add/", {**data, "chat_id": "c1"}).status_code == 302
    row = Schedule.objects.get(name=data["name"])
    assert (row.periodic_task.enabled, row.periodic_task.kwargs) == (True, f'{{"schedule_id": {row.pk}}}')
    change = f"/admin/tasks/schedule/{row.pk}/change/"
    assert client.post(change, {**data, "chat_id": "c1", "enabled": ""}).status_code == 302
    assert not PeriodicTask.objects.get(pk=row.periodic_task_id).enabled
    assert client.get(change).status_code == 200
    assert client.post(f"/admin/tasks/schedule/{row.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not PeriodicTask.objects.filter(pk=row.periodic_task_id).exists()


def _clock():
    from django_celery_beat.models import ClockedSchedule

    return ClockedSchedule.objects.create(clocked_time=datetime.now(UTC) + timedelta(days=1))


def test_a_resumed_schedule_does_not_catch_up_its_pause():
    tt = define(unique("pause"), lane="t-sched")
    interval, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    row = Schedule.objects.create(name=unique("pause"), task_type=tt, interval=interval)
    Schedule.objects.filter(pk=row.pk).update(anchor_at=row.anchor_at - timedelta(hours=2),
                                              since_at=row.anchor_at - timedelta(hours=2),
                                              last_due_at=row.anchor_at - timedelta(hours=1), enabled=False)
    row.refresh_from_db()
    row.enabled = True
    row.save()
    assert beat.fire(row.pk).action == "wait"  # the paused hour is not this schedule's to fire


def test_the_dashboard_shows_each_schedules_next_fire_and_last_outcome(client):
    from lanes.models import Lane

    lane = unique("tsch")
    tt = define(unique("dash"), lane=lane)
    interval, _ = IntervalSchedule.objects.get_or_create(every=3600, period="seconds")
    row = Schedule.objects.create(name=unique("dash"), task_type=tt, interval=interval)
    back = row.anchor_at - timedelta(hours=1, seconds=10)
    Schedule.objects.filter(pk=row.pk).update(anchor_at=back, since_at=back)
    Lane.objects.filter(name=lane).update(accepting=False)
    decision = beat.fire(row.pk)
    assert decision.action == "fire"
    html = unescape(client.get("/admin/dashboard/").content.decode())
    part = html[html.index(f'data-schedule="{row.name}"'):]
    part = part[:part.index("</tr>")]
    assert decision.next_due.strftime("%Y-%m-%d %H:%M:%S") in part
    assert "<strong>refused</strong>: <span data-field=\"reason\">lane_closed" in part


def test_the_readmes_daily_digest_applies_and_is_due_at_nine_in_berlin():
    import json
    from pathlib import Path
    from zoneinfo import ZoneInfo

    from tasks.schedules import latest_due, next_due

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("<!-- schedules-example -->", 1)[1].split("```json\n", 1)[1].split("\n```", 1)[0]
    example = json.loads(block)
    assert example["schedules"][0]["task_type"] == "demo.echo"  # make run's default type; here a fresh one
    entry = {**example["schedules"][0], "name": unique("digest"), "task_type": define(unique("digest")).name}
    assert apply_config({"schedules": [entry]}) == {"retry_policies": 0, "lanes": 0, "task_types": 0, "schedules": 1}
    defn = Schedule.objects.get(name=entry["name"]).definition()
    winter = next_due(defn, datetime(2026, 12, 2, 9, tzinfo=UTC))
    summer = latest_due(defn, datetime(2027, 7, 1, 12, tzinfo=UTC))
    assert winter == datetime(2026, 12, 3, 8, tzinfo=UTC) and summer == datetime(2027, 7, 1, 7, tzinfo=UTC)
    assert {d.astimezone(ZoneInfo("Europe/Berlin")).hour for d in (winter, summer)} == {9}


def test_saving_a_schedule_opened_before_a_fire_keeps_the_fire_state():
    tt = define(unique("stale"), lane=unique("tsch"))
    interval, _ = IntervalSchedule.objects.get_or_create(every=3600, period="seconds")
    row = Schedule.objects.create(name=unique("stale"), task_type=tt, interval=interval)
    back = row.anchor_at - timedelta(hours=1, seconds=5)
    Schedule.objects.filter(pk=row.pk).update(anchor_at=back, since_at=back)
    opened = Schedule.objects.get(pk=row.pk)  # an operator's form, opened now
    assert beat.fire(row.pk).action == "fire"
    opened.payload = {"edited": True}
    opened.save()
    saved = Schedule.objects.get(pk=row.pk)
    assert saved.payload == {"edited": True}
    assert (saved.fired_count, saved.last_outcome, saved.last_due_at) == (1, "fired", back + timedelta(hours=1))
    assert beat.fire(row.pk).action == "wait"  # the due time is not fired again


def test_beat_loads_a_crontab_schedule_whatever_the_hour_so_a_missed_one_is_caught_up():
    from celery import current_app
    from django_celery_beat.models import CrontabSchedule
    from django_celery_beat.schedulers import DatabaseScheduler

    # Twelve hours away, far outside django-celery-beat's window of the hour +/- 2; never 4, the hour it
    # always loads (Celery's default cleanup): 16:00-16:59 UTC made 4, and the first assertion failed.
    far = (datetime.now(UTC).hour + 12) % 24
    far_hour = str(5 if far == 4 else far)
    crontab, _ = CrontabSchedule.objects.get_or_create(minute="0", hour=far_hour, day_of_week="*",
                                                       day_of_month="*", month_of_year="*", timezone="UTC")
    row = Schedule.objects.create(name=unique("far"), task_type=define(unique("far"), lane="t-sched"),
                                  crontab=crontab)
    app = current_app._get_current_object()
    assert row.periodic_task_id not in [m.pk for m in DatabaseScheduler(app=app, lazy=True).enabled_models()]
    assert row.periodic_task_id in [m.pk for m in beat.Scheduler(app=app, lazy=True).enabled_models()]


def test_a_type_that_forgets_idempotency_keys_at_once_cannot_be_scheduled():
    prefix = unique("cfw")
    data = {**config(prefix, idempotency_window=0),
            "schedules": [{"name": f"{prefix}-s", "task_type": f"{prefix}.echo", "interval": {"every": 5}}]}
    with pytest.raises(ConfigError, match=re.escape(f"schedules[0] '{prefix}-s': task_type: Task type "
                                                    f"'{prefix}.echo' keeps idempotency keys 0 s")):
        apply_config(data)
