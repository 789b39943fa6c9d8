"""The admin's task-type form shows the dedupe mode and window, saves them, and refuses a bad pair by name."""

from __future__ import annotations

import pytest

from tasks.models import TaskType
from tests.browser.conftest import shot
from tests.browser.test_dashboard_browser import login
from tests.support.helpers import define, unique

pytestmark = [pytest.mark.browser]


def test_the_task_type_form_shows_and_saves_the_dedupe_mode(page, live_server, operator_login):
    tt = define(unique("ddb"), timeout=60)
    path = f"/admin/tasks/tasktype/{tt.pk}/change/"
    login(page, live_server, operator_login, next_path=path)
    assert page.locator("fieldset h2", has_text="Throttle and debounce").count() == 1
    options = page.locator("#id_dedupe option").all_inner_texts()
    assert [o.split(" ")[0] for o in options] == ["key", "throttle", "debounce"]
    assert page.input_value("#id_dedupe") == "key"
    # A throttle without a window is refused, naming the window.
    page.select_option("#id_dedupe", "throttle")
    page.fill("#id_dedupe_window", "0")
    page.click("input[name=_continue]")
    assert "needs a dedupe window above 0" in page.inner_text(".field-dedupe_window .errorlist")
    tt.refresh_from_db()
    assert tt.dedupe == "key"
    # A debounce of 2.5 s saves, and the form shows it again.
    page.select_option("#id_dedupe", "debounce")
    page.fill("#id_dedupe_window", "2.5")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    shot(page, "tasktype-dedupe")
    tt.refresh_from_db()
    assert (tt.dedupe, tt.dedupe_window) == ("debounce", 2.5)
    assert page.input_value("#id_dedupe") == "debounce" and float(page.input_value("#id_dedupe_window")) == 2.5
    TaskType.objects.filter(pk=tt.pk).delete()
