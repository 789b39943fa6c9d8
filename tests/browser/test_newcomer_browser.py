"""Issue 13: a newcomer's whole journey through the admin, in a real Chromium, under the CSP.

Log in; make a retry policy, a lane and a task type with the admin's forms; make
an API token in the admin (shown once, in a message); dispatch through the HTTP
API with it; watch the task through the API until it is dead-lettered; follow
the admin link its failure carries to the dead-letter list, open the row,
press its Requeue button and see the row requeued. The lane is made at run
time, so it is served by a catch-all worker (``DISPATCH_CATCH_ALL=1``), the
way ``make run``'s default group serves it. Only public surfaces: pages, URLs,
the HTTP API.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from tests.browser.conftest import shot
from tests.browser.test_dashboard_browser import login
from tests.support.helpers import unique, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _api(base: str, token: str, method: str, path: str, data: dict | None = None) -> tuple[int, dict]:
    """One HTTP API call over the loopback, as a service in another language would make it."""
    request = urllib.request.Request(f"{base}/api/v1{path}", method=method,
                                     data=None if data is None else json.dumps(data).encode(),
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _save(page, expect: str) -> None:
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist")
    assert expect in page.inner_text("ul.messagelist"), page.inner_text("#content")


def test_newcomer_makes_a_type_dispatches_over_http_and_requeues_its_dead_letter(
        page, live_server, operator_login, start_worker):
    policy, lane, type_name, service = unique("nc-once"), unique("nc-lane"), unique("nc.fail"), unique("nc-svc")
    # Dead-letter messages link into this admin; the catch-all worker adopts lanes made at run time.
    start_worker(unique("nc-own"), concurrency=2,
                 env={"DISPATCH_CATCH_ALL": "1", "DISPATCH_ADMIN_URL": f"{live_server}/admin/"})

    login(page, live_server, operator_login, next_path="/admin/")

    page.goto(f"{live_server}/admin/tasks/retrypolicy/add/")
    page.fill("#id_name", policy)
    page.fill("#id_max_retries", "1")
    page.fill("#id_initial_backoff", "0.1")
    page.fill("#id_max_backoff", "0.5")
    _save(page, "was added successfully")

    page.goto(f"{live_server}/admin/lanes/lane/add/")
    page.fill("#id_name", lane)
    _save(page, "was added successfully")

    page.goto(f"{live_server}/admin/tasks/tasktype/add/")
    page.fill("#id_name", type_name)
    page.select_option("#id_handler", "demo.flaky")
    page.select_option("#id_lane", label=lane)
    page.select_option("#id_retry_policy", label=policy)
    page.fill("#id_timeout", "60")
    page.fill("#id_attempt_timeout", "10")
    _save(page, "was added successfully")

    page.goto(f"{live_server}/admin/api/servicetoken/add/")
    page.fill("#id_name", service)
    page.select_option("#id_task_types_from", label=type_name)
    page.click("#id_task_types_add")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist")
    shot(page, "newcomer-token-shown-once")
    found = re.search(r"dsp_[A-Za-z0-9]+_[A-Za-z0-9_-]+", page.inner_text("ul.messagelist code"))
    assert found, page.inner_text("ul.messagelist")
    token = found.group(0)

    status, result = _api(live_server, token, "POST", "/dispatch",
                          {"task_type": type_name, "payload": {"fail": "fatal", "order": 1}})
    assert status == 202 and result["accepted"] is True and result["queue"] == lane, (status, result)
    task_id = result["task_id"]

    def dead() -> dict | None:
        code, state = _api(live_server, token, "GET", f"/tasks/{task_id}")
        assert code == 200, (code, state)
        # The dead-letter row is written before the outcome (the record reads STARTED until then), and
        # the result row after it (``task_name`` is the row's: None until it is stored).
        return state if state["dead_letter"] and state["state"] not in ("PENDING", "STARTED") \
            and state["task_name"] is not None else None

    state = wait_until(dead, timeout=60, interval=0.5, what="the task to be dead-lettered")
    assert state["state"] == "FAILURE" and state["task_name"] == type_name, state  # the task type, not its handler
    assert state["dead_letter"]["reason"] == "non_retryable" and state["dead_letter"]["status"] == "dead", state
    link = f"{live_server}/admin/tasks/deadletter/?task_id={task_id}"
    # The failure's message (what ``DeadLettered`` says) names the reason and links to the row in the admin.
    assert link in " ".join(state["result"]["exc_message"]), state["result"]

    # The failure's link opens the dead-letter list on that one row; the row opens its page.
    page.goto(link)
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert type_name in rows.first.inner_text() and "non_retryable" in rows.first.inner_text()
    rows.first.locator("th a").click()
    page.wait_for_selector("#requeue-button")
    assert task_id in page.inner_text("#content")
    shot(page, "newcomer-dead-letter-detail")

    page.click("#requeue-button")
    page.wait_for_selector("ul.messagelist")
    message = page.inner_text("ul.messagelist")
    new_id = re.search(rf"{re.escape(task_id)} requeued as task (\S+)\.", message)
    assert new_id, message
    assert page.locator("#requeue-button").count() == 0
    assert "requeued" in page.inner_text(".field-status").lower()

    # The list shows the row requeued, linked to its new task; the new task runs (and fails again).
    page.goto(link)
    row = page.locator("#result_list tbody tr").first
    assert "requeued" in row.inner_text().lower() and new_id.group(1)[:8] in row.inner_text()
    code, again = _api(live_server, token, "GET", f"/tasks/{new_id.group(1)}")
    assert code == 200 and again["task_id"] == new_id.group(1)
    shot(page, "newcomer-requeued")
