"""Issue 13 item 8 in a real Chromium at 1,400 px, under the Content-Security-Policy.

The ``page`` fixture fails a test on any CSP violation a page reports.
"""

from __future__ import annotations

import pytest

from tasks import dead_letters
from tasks.models import DeadLetter
from tests.browser.conftest import shot
from tests.browser.test_dashboard_browser import login
from tests.support.helpers import define, unique

pytestmark = [pytest.mark.browser]

WIDTH = 1400


def _fits(page, selector: str) -> dict:
    return page.evaluate(
        """(sel) => { const el = document.querySelector(sel); const box = el.getBoundingClientRect();
                      return {scroll: el.scrollWidth, right: box.right, page: document.documentElement.clientWidth,
                              doc: document.documentElement.scrollWidth}; }""", selector)


def _busy(snapshot):
    """The real snapshot with every lane as full as its numbers get: six-digit counts, rates, all retry attempts."""

    def busy(*args, **kwargs):
        snap = snapshot(*args, **kwargs)
        for lane in snap["lanes"]:
            lane.update(depth=123456, scheduled_retries=23456, chat_waiting=34567, in_flight=4567, waiting=160000,
                        dead_letters=12345, draining=True, paused=True, accepting=False, capacity=1000000,
                        admission="draining", consuming="paused")
            s = lane["stats"]
            for kind in ("dispatched", "completed"):
                s[f"{kind}_per_s"] = {w: 1234.567 for w in s[f"{kind}_per_s"]}
            s["counts_15m"] = dict.fromkeys(s["counts_15m"], 1234567)
            s["failure_rate_15m"] = 0.1234
            s["retries_by_attempt_15m"] = {str(a): 12345 for a in range(1, 7)}
            s["queue_latency_p50_s"], s["queue_latency_p95_s"] = 118.5, 7200.0
        return snap

    return busy


def test_dashboard_lane_table_fits_a_1400px_page(page, live_server, operator_login, monkeypatch):
    from ops import metrics

    for i in range(3):
        define(unique(f"pc-type{i}"), lane=unique(f"pc-lane-with-a-long-name-{i}"))
    monkeypatch.setattr(metrics, "snapshot", _busy(metrics.snapshot))  # the site runs in this process
    page.set_viewport_size({"width": WIDTH, "height": 900})
    login(page, live_server, operator_login)
    assert page.locator("#lanes-table a[data-action=resume]").count() >= 3  # the controls column is there
    size = _fits(page, "#lanes-table")
    shot(page, "dashboard-1400")
    assert size["scroll"] <= size["page"] and size["right"] <= size["page"], size
    assert size["doc"] <= size["page"], size  # no horizontal scrollbar on the page either


def test_task_type_changelist_shows_enabled(page, live_server, operator_login):
    name = unique("pc-enabled")
    define(name, enabled=False, lane=unique("pc-a-rather-long-lane-name-for-the-list"))
    page.set_viewport_size({"width": WIDTH, "height": 900})
    # Filtered to this type: other tests fill the shared database past one page of the list.
    login(page, live_server, operator_login, next_path="/admin/tasks/tasktype/")
    page.goto(f"{live_server}/admin/tasks/tasktype/?q={name}")
    shot(page, "tasktype-changelist-1400")
    # The list scrolls inside its box (.results): the column must be inside the visible part of it.
    seen = page.evaluate("""() => {
        const box = document.querySelector('#changelist .results').getBoundingClientRect();
        const th = document.querySelector('#result_list th.column-enabled').getBoundingClientRect();
        return {th_right: th.right, th_left: th.left, box_right: box.right, page: window.innerWidth}; }""")
    assert seen["th_left"] >= 0 and seen["th_right"] <= min(seen["box_right"], seen["page"]), seen
    row = page.locator("#result_list tbody tr", has_text=name)
    assert row.locator("td.field-enabled img[alt=False]").is_visible()


def test_dead_letter_detail_page_requeues(page, live_server, operator_login):
    type_name = unique("pc-dead")
    define(type_name, lane=unique("pc-dead-lane"))
    row = dead_letters.record(task_id=unique("pc-task"), task_type=type_name, lane="x", reason="exhausted",
                              payload={"n": 1}, attempts=3)
    path = f"/admin/tasks/deadletter/{row.pk}/change/"
    page.set_viewport_size({"width": WIDTH, "height": 900})
    login(page, live_server, operator_login, next_path=path)
    page.click("#requeue-button")
    page.wait_for_selector("ul.messagelist")
    row.refresh_from_db()
    assert row.status == DeadLetter.Status.REQUEUED and row.requeued_task_id
    assert f"requeued as task {row.requeued_task_id}" in page.inner_text("ul.messagelist")
    assert page.locator("#requeue-button").count() == 0  # a requeued row offers no second requeue
    shot(page, "deadletter-detail-requeued")


def test_task_type_form_shows_only_the_json_error(page, live_server, operator_login):
    define(unique("pc-form"))  # a lane and a policy to choose
    page.set_viewport_size({"width": WIDTH, "height": 900})
    login(page, live_server, operator_login, next_path="/admin/tasks/tasktype/add/")
    page.fill("#id_name", unique("pc-new"))
    page.select_option("#id_handler", "http.post")
    page.select_option("#id_lane", index=1)
    page.select_option("#id_retry_policy", index=1)
    page.fill("#id_options", '{"url": ')
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    errors = page.locator(".field-options .errorlist li").all_inner_texts()
    assert errors == ["Enter a valid JSON."], errors
    shot(page, "tasktype-form-json-error")


def test_api_docs_page_works_under_the_csp(page, live_server, operator_login):
    """The API's interactive docs (Swagger UI) are served from the site itself, with no inline script."""
    login(page, live_server, operator_login, next_path="/admin/")
    page.goto(f"{live_server}/api/v1/docs")
    page.wait_for_selector("#swagger-ui .opblock", timeout=20_000)  # Swagger UI ran and drew the operations
    shot(page, "api-docs")
