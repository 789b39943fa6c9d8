"""Schedules in a real headless Chromium: the admin's add form refuses a bad payload, the dashboard shows the fires."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.browser.conftest import shot
from tests.browser.test_dashboard_browser import login
from tests.support.helpers import define, unique

pytestmark = [pytest.mark.browser]


def test_add_a_schedule_in_the_admin_then_read_its_next_fire_and_last_outcome_on_the_dashboard(
        page, live_server, operator_login):
    from django_celery_beat.models import IntervalSchedule

    from tasks import beat
    from tasks.models import Schedule

    tt = define(unique("brs"), lane=unique("tsch"))
    interval, _ = IntervalSchedule.objects.get_or_create(every=1, period="hours")
    name = unique("digest")
    login(page, live_server, operator_login, "/admin/tasks/schedule/add/")
    page.fill("#id_name", name)
    page.select_option("#id_task_type", str(tt.pk))
    page.select_option("#id_interval", str(interval.pk))
    page.fill("#id_payload", '["not", "an", "object"]')
    page.click("input[name=_save]")
    error = page.inner_text(".field-payload .errorlist")
    assert "Payload must be a JSON object ({...}), not an array." in error
    assert not Schedule.objects.filter(name=name).exists()
    shot(page, "schedule-bad-payload")

    page.fill("#id_payload", '{"list": "team"}')
    page.click("input[name=_save]")
    page.wait_for_url(f"{live_server}/admin/tasks/schedule/")
    row = Schedule.objects.get(name=name)
    assert row.payload == {"list": "team"} and row.periodic_task.enabled

    # An hour and a little later, as a beat would see it: one fire, through admission.
    back = row.anchor_at - timedelta(hours=1, seconds=5)
    Schedule.objects.filter(pk=row.pk).update(anchor_at=back, since_at=back)
    decision = beat.fire(row.pk)
    assert decision is not None and decision.action == "fire"
    fired = Schedule.objects.get(pk=row.pk)
    page.goto(f"{live_server}/admin/dashboard/")
    selector = f'#schedules-table tr[data-schedule="{name}"]'
    assert page.inner_text(f'{selector} [data-field="next_fire"]').strip() == \
        decision.next_due.strftime("%Y-%m-%d %H:%M:%S")
    outcome = page.inner_text(f'{selector} [data-field="outcome"]')
    assert outcome.startswith("fired") and fired.last_task_id in outcome
    assert page.inner_text(f'{selector} [data-field="counts"]').strip() == "1 / 0 / 0"
    shot(page, "schedule-dashboard")
