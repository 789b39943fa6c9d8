"""The operator's pages in a real headless Chromium: login, dashboard numbers, lane controls, dead letters.

Screenshots go to test-artifacts/. The under-load test also writes the README's
picture when asked: ``DASHBOARD_SCREENSHOT=docs/dashboard.png DASHBOARD_LOAD_S=180
.venv/bin/python -m pytest tests/browser -k under_load``.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pytest

from lanes.models import Lane
from tasks.dispatch import dispatch
from tasks.models import DeadLetter
from tests.browser.conftest import shot
from tests.support.helpers import define, unique, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def login(page, live_server: str, user: tuple[str, str], next_path: str = "/admin/dashboard/") -> None:
    page.goto(f"{live_server}/admin/login/?next={next_path}")
    page.fill("#id_username", user[0])
    page.fill("#id_password", user[1])
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server}{next_path}")


def cell(page, lane: str, field: str) -> str:
    return page.inner_text(f'#lanes-table tr[data-lane="{lane}"] [data-field="{field}"]').strip()


def test_logged_out_visitor_is_sent_to_the_login_page(page, live_server):
    for path in ("/admin/dashboard/", "/admin/tasks/deadletter/"):
        page.goto(f"{live_server}{path}")
        assert page.url.startswith(f"{live_server}/admin/login/?next={path}")
        assert page.is_visible("#id_username")
    shot(page, "logged-out-redirect")


def test_dashboard_numbers_close_a_lane_and_requeue_a_dead_letter(page, live_server, operator_login, start_worker):
    lane, parked = unique("b-lane"), unique("b-parked")
    echo, fatal, waiting = unique("b-echo"), unique("b-fatal"), unique("b-wait")
    define(echo, lane=lane)
    define(fatal, handler="demo.flaky", lane=lane)
    define(waiting, lane=parked)
    start_worker(lane, concurrency=2)
    ok = [dispatch.delay(echo, {"i": i}) for i in range(3)]
    dead = [dispatch.delay(fatal, {"fail": "fatal", "i": i}) for i in range(2)]
    assert all(r.accepted for r in ok + dead)
    assert dispatch.delay(echo, "not an object").reason == "invalid_payload"
    for _ in range(2):
        assert dispatch.delay(waiting, {}).accepted
    for r in ok:
        r.get(timeout=30)
    wait_until(lambda: DeadLetter.objects.filter(lane=lane, status="dead").count() == 2, what="two dead letters")
    # Outcome counters are kept in each worker process and reach Redis with its next beat
    # (at most a second late; docs/redis-budget.md): the page reads them once they have.
    from ops.metrics import snapshot

    def counted() -> bool:
        row = next(r for r in snapshot(lane_names=[lane])["lanes"] if r["name"] == lane)
        counts = row["stats"]["counts_15m"]
        return (counts["succeeded"], counts["dead"]) == (3, 2)

    wait_until(counted, timeout=10, what="the workers' counts flushed")

    login(page, live_server, operator_login)
    assert page.is_visible(f'#lanes-table tr[data-lane="{lane}"]')
    assert [cell(page, lane, f) for f in ("dispatched_15m", "succeeded_15m", "dead_15m", "rejected_15m")] == [
        "5", "3", "2", "1"]
    assert cell(page, lane, "dead_letters") == "2" and cell(page, lane, "in_flight") == "0"
    assert cell(page, lane, "admission") == "open" and cell(page, lane, "consuming") == "consuming"
    assert cell(page, parked, "depth") == "2"
    assert cell(page, parked, "consuming") == "no worker"  # issue 13: nothing consumes the parked lane
    assert page.is_visible(f'#lanes-table tr.lane-unconsumed[data-lane="{parked}"] .no-consumer-warning')
    assert page.get_attribute("#flower-link", "href")
    shot(page, "dashboard-mix")

    # The page refreshes itself: a new task shows up without a reload.
    page.evaluate("window.__sameDocument = true")
    assert dispatch.delay(waiting, {}).accepted
    page.wait_for_function(
        f"""() => document.querySelector('#lanes-table tr[data-lane="{parked}"] [data-field="depth"]')
                   .textContent.trim() === '3'""")
    assert page.evaluate("window.__sameDocument") is True

    # Dead letters of the lane, from the dashboard's link; requeue one and it leaves the list.
    page.click(f'#lanes-table tr[data-lane="{lane}"] a.deadletter-link')
    page.wait_for_url("**/admin/tasks/deadletter/**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    first = rows.nth(0)
    requeued_prefix = first.locator("td.field-task_link").inner_text().strip()
    assert len(requeued_prefix) == 8
    shot(page, "deadletters-of-lane")
    first.locator("input.action-select").check()
    page.select_option("select[name=action]", "requeue")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    assert "requeued 1 dead letter" in page.inner_text("ul.messagelist").lower()
    remaining = [t.strip() for t in page.locator("#result_list tbody td.field-task_link").all_inner_texts()]
    assert requeued_prefix not in remaining
    row = DeadLetter.objects.get(task_id__startswith=requeued_prefix)
    assert row.status == "requeued" and row.requeued_task_id and row.resolved_by == operator_login[0]
    shot(page, "deadletter-requeued")

    # Close the lane from the dashboard: a confirmation page, then dispatch answers lane_closed.
    page.goto(f"{live_server}/admin/dashboard/")
    page.click(f'#lanes-table tr[data-lane="{lane}"] a[data-action="close"]')
    page.wait_for_selector("#confirm-button")
    shot(page, "close-confirmation")
    assert Lane.objects.get(name=lane).accepting
    page.click("#confirm-button")
    page.wait_for_url(f"{live_server}/admin/dashboard/")
    assert cell(page, lane, "admission") == "closed"
    assert f"lane {lane} refuses new tasks" in page.inner_text("ul.messagelist").lower()
    refused = dispatch.delay(echo, {})
    assert not refused.accepted and refused.reason == "lane_closed"
    assert operator_login[0] in page.inner_text(".lane-events")
    shot(page, "lane-closed")
    page.click(f'#lanes-table tr[data-lane="{lane}"] a[data-action="open"]')
    page.click("#confirm-button")
    page.wait_for_url(f"{live_server}/admin/dashboard/")
    assert cell(page, lane, "admission") == "open"
    assert dispatch.delay(echo, {}).accepted


def _load_config(screenshot: bool) -> dict[str, str]:
    """Lanes and types for the load: the shipped defaults for the README picture, unique ones otherwise."""
    if screenshot:
        from tasks.config_io import apply_config

        apply_config(json.loads((ROOT / "tasks" / "defaults" / "default_config.json").read_text()))
        define("demo.flaky", handler="demo.flaky", lane="default",
               policy={"max_retries": 2, "initial_backoff": 0.5, "jitter": 0.2})
        return {"realtime": "realtime", "default": "default", "bulk": "bulk", "chat": "loadtest.sink",
                "echo": "demo.echo", "flaky": "demo.flaky", "bulk_type": "bulk.echo"}
    names = {"realtime": unique("realtime"), "default": unique("default"), "bulk": unique("bulk")}
    names.update(chat=unique("ld-chat"), echo=unique("ld-echo"), flaky=unique("ld-flaky"), bulk_type=unique("ld-bulk"))
    define(names["chat"], handler="loadtest.sink", lane=names["realtime"], chat_scoped=True, chat_queue_size=1000)
    define(names["echo"], lane=names["default"])
    define(names["flaky"], handler="demo.flaky", lane=names["default"],
           policy={"max_retries": 2, "initial_backoff": 0.5, "jitter": 0.2})
    return names


LOAD_S = float(os.environ.get("DASHBOARD_LOAD_S", "15"))


@pytest.mark.timeout(int(LOAD_S) + 240)
def test_dashboard_under_load(page, live_server, operator_login, start_worker):
    target = os.environ.get("DASHBOARD_SCREENSHOT")
    duration = LOAD_S
    names = _load_config(bool(target))
    define(names["bulk_type"], lane=names["bulk"])
    lanes = f"{names['realtime']},{names['default']},{names['bulk']}"
    start_worker(lanes, pool="threads", concurrency=8)
    stop = threading.Event()
    counts = {"accepted": 0}

    def produce() -> None:
        rng = random.Random(7)
        seq: dict[str, int] = {}
        started = time.monotonic()
        while not stop.is_set():
            phase = (time.monotonic() - started) % 60
            for _ in range(3):
                chat = f"chat-{rng.randrange(40)}"
                seq[chat] = seq.get(chat, 0) + 1
                r = dispatch.delay(names["chat"], {"latency_ms": rng.uniform(10, 80), "seq": seq[chat],
                                                   "run": "dash"}, chat_id=chat)
                counts["accepted"] += r.accepted
            dispatch.delay(names["echo"], {"sleep": rng.uniform(0.02, 0.2)}, priority=rng.choice((2, 5, 8)))
            if rng.random() < 0.15:
                mode = rng.choice(("retry", "retry", "fatal"))
                dispatch.delay(names["flaky"], {"fail": mode, "fail_times": rng.choice((1, 2, 5))})
            if rng.random() < 0.3:  # one hot chat gets more than it can take: its backlog grows
                seq["hot"] = seq.get("hot", 0) + 1
                dispatch.delay(names["chat"], {"latency_ms": 800, "seq": seq["hot"], "run": "dash"},
                               chat_id="chat-hot")
            if rng.random() < 0.05:
                dispatch.delay(names["echo"], ["not", "an", "object"])  # a rejection now and then
            if rng.random() < 0.02:
                dispatch.delay("reports.daily", {})  # unknown_type
            if phase < 2 and rng.random() < 0.5:  # a bulk burst at the top of each minute
                for _ in range(40):
                    dispatch.delay(names["bulk_type"], {"sleep": 0.05}, priority=1)
            stop.wait(0.1)

    producer = threading.Thread(target=produce, name="dashboard-load", daemon=True)
    login(page, live_server, operator_login)
    producer.start()
    refreshed = set()
    realtime = names["realtime"]
    rate = f'#lanes-table tr[data-lane="{realtime}"] [data-field="completed_per_s_1m"]'
    chart = f'figure.chart[data-lane="{realtime}"] svg polyline.throughput'

    def shown() -> bool:
        """What the assertions below read is on the page (a README picture runs the whole load)."""
        if target or len(refreshed) < 2 or page.locator(chart).count() < 1 or page.locator(rate).count() != 1:
            return False
        try:
            return float(page.inner_text(rate)) > 0
        except ValueError:  # not a number yet
            return False

    deadline = time.monotonic() + duration  # at most the load's length, as when it always ran it all
    try:
        while time.monotonic() < deadline and not shown():
            value = page.get_attribute("#dashboard-live", "data-refreshed")
            if value:
                refreshed.add(value)
            page.wait_for_timeout(500)
        page.wait_for_function(
            "() => document.querySelector('#dashboard-live').getAttribute('data-refreshed') !== null")
        # One more refresh with the load still running.
        page.wait_for_function("last => document.querySelector('#dashboard-live')"
                               ".getAttribute('data-refreshed') !== last",
                               arg=page.get_attribute("#dashboard-live", "data-refreshed"), timeout=15000)
        if target:
            page.screenshot(path=str(ROOT / target), full_page=True)
        shot(page, "dashboard-under-load")
    finally:
        stop.set()
        producer.join(timeout=30)
    assert counts["accepted"] > 0
    assert len(refreshed) >= 2, "the dashboard did not refresh itself during the load"
    assert float(page.inner_text(rate)) > 0
    assert page.locator(chart).count() >= 1
