"""A task's history page in a real headless Chromium, under the site's CSP: from the task search to the page,
its attempts, its retry and its progress (a note holding markup shows as text)."""

from __future__ import annotations

import pytest
from django_celery_results.models import TaskResult

from tasks.dispatch import dispatch
from tests.browser.conftest import shot
from tests.browser.test_dashboard_browser import login
from tests.support.helpers import define, unique, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTE = "<script>document.title='pwned'</script> half way"


def test_the_history_page_shows_attempts_retries_and_progress(page, live_server, operator_login, start_worker):
    lane = unique("lbh")
    flaky, reporting = unique("bh-flaky"), unique("bh-progress")
    define(flaky, handler="demo.flaky", lane=lane,
           policy={"max_retries": 2, "initial_backoff": 0.1, "multiplier": 2.0, "max_backoff": 1.0, "jitter": 0.0})
    define(reporting, handler="demo.progress", lane=lane)
    start_worker(lane, pool="threads", concurrency=2)
    retried = dispatch.delay(flaky, {"fail": "retry", "fail_times": 1}).task_id
    progressing = dispatch.delay(reporting, {"steps": 2, "note": NOTE}).task_id
    for task_id in (retried, progressing):
        wait_until(lambda t=task_id: TaskResult.objects.filter(task_id=t, status="SUCCESS").exists(), timeout=60,
                   what=f"{task_id} done")
    login(page, live_server, operator_login)
    page.goto(f"{live_server}/admin/dashboard/tasks/?kind=task&q={retried}")
    page.click(f'#search-results tr[data-task="{retried}"] a.history-link')
    page.wait_for_selector("#task-history")

    def attempts_shown() -> bool:
        page.reload()
        return page.inner_text("#attempt-count") == "2"

    wait_until(attempts_shown, timeout=10, what="2 attempts on the page")
    outcomes = page.locator("#history-attempts tr.attempt").evaluate_all("rows => rows.map(r => r.dataset.outcome)")
    assert outcomes == ["failed, retried", "succeeded"]
    assert "0.100 s" in page.inner_text("#history-attempts")
    assert page.inner_text("#history-state") == "succeeded"
    shot(page, "history-retried")

    page.goto(f"{live_server}/admin/tasks/history/{progressing}/")
    page.wait_for_selector("#history-progress")
    assert page.inner_text("#progress-percent") == "100%"
    assert page.inner_text("#progress-note") == NOTE  # shown as text, never run
    assert page.title() != "pwned"
    assert "tombstone" not in page.content().lower()
    shot(page, "history-progress")
