"""The task search and its cancel buttons in a real headless Chromium, under the site's CSP
(the ``page`` fixture fails the test on any Content-Security-Policy violation)."""

from __future__ import annotations

import pytest

from lanes import keys
from lanes.redis_client import get_redis
from tasks.dispatch import dispatch
from tests.browser.conftest import shot
from tests.browser.test_dashboard_browser import login
from tests.support.helpers import define, unique

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_find_a_chat_from_the_dashboard_and_cancel_a_task_then_the_chat(page, live_server, operator_login):
    name, lane, chat = unique("bc"), unique("lbc"), unique("chat")
    define(name, lane=lane, chat_scoped=True)
    ids = [dispatch.delay(name, {"n": i}, chat_id=chat).task_id for i in range(30)]
    login(page, live_server, operator_login)
    # From the dashboard's top chats to the search page, the chat already searched.
    page.click(f'#chats-table a.cancel-chat-link[href$="q={chat}"]')
    page.wait_for_selector("#search-results")
    assert page.locator("#search-results tbody tr").count() == 30
    shot(page, "cancel-search-chat")
    # Cancel one message in the middle, with a reason.
    row = page.locator(f'#search-results tr[data-task="{ids[5]}"]')
    row.locator("input[name=reason]").fill("user deleted it")
    row.locator("input.cancel-button").click()
    page.wait_for_selector(".messagelist")
    assert "cancelled" in page.inner_text(".messagelist")
    # Back on the search of that task: Redis keeps its outcome (the record itself is settled).
    assert page.inner_text(f'#search-results tr[data-task="{ids[5]}"] [data-field="state"]') == "cancelled"
    assert not get_redis().exists(keys.task_record(ids[5], chat))
    # Search by task id (the form) shows the same.
    page.fill("#search-q", ids[5])
    page.select_option("#search-kind", "task")
    page.click("#search-button")
    page.wait_for_selector("#search-results")
    assert page.inner_text('#search-results [data-field="state"]') == "cancelled"
    assert page.locator("#search-results input.cancel-button").count() == 0  # nothing left to cancel
    # Then everything queued for the chat.
    page.goto(f"{live_server}/admin/dashboard/tasks/?kind=chat&q={chat}")
    page.click("#cancel-chat-button")
    page.wait_for_selector(".messagelist")
    assert "29 cancelled" in page.inner_text(".messagelist")
    assert page.is_visible("#search-empty")
    assert not get_redis().exists(keys.chat_queue(chat))
    shot(page, "cancel-chat-done")


def test_purge_a_lane_with_the_typed_name(page, live_server, operator_login):
    name, lane = unique("bp"), unique("lbp")
    define(name, lane=lane)
    for i in range(4):
        dispatch.delay(name, {"n": i})
    login(page, live_server, operator_login)
    page.click(f'#lanes-table tr[data-lane="{lane}"] a[data-action="purge"]')
    page.wait_for_selector("#purge-confirm")
    page.fill("#purge-name", "wrong")
    page.click("#confirm-button")
    page.wait_for_selector("#purge-error")
    page.fill("#purge-name", lane)
    page.click("#confirm-button")
    page.wait_for_selector(".messagelist")
    assert "4 waiting task(s) cancelled" in page.inner_text(".messagelist")
