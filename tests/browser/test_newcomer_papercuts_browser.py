"""What a newcomer's second hour met in the browser: labels that fit their buttons, a docs page that says it all.

- Every lane control on the dashboard (``Purge queued`` was the one that spilled)
  keeps its label on one line, inside its button.
- ``/api/v1/docs`` shows the header to send, ``Authorization: Bearer <service token>``,
  with the placeholder as text (it was eaten as an HTML tag).
"""

from __future__ import annotations

import pytest

from tests.browser.conftest import shot
from tests.browser.test_dashboard_browser import login
from tests.support.helpers import define, unique

pytestmark = [pytest.mark.browser]


def test_every_lane_control_label_fits_its_button(page, live_server, operator_login):
    for _ in range(3):
        define(unique("pc.type"), lane=unique("papercut-lane-with-a-long-name"))
    login(page, live_server, operator_login)
    page.wait_for_selector('#lanes-table a[data-action="purge"]')
    shot(page, "dashboard-controls")
    buttons = page.eval_on_selector_all("#lanes-table td.controls a.button", """els => els.map(el => {
        const style = getComputedStyle(el);
        return {text: el.textContent.trim(), lines: el.getClientRects().length,
                height: el.getBoundingClientRect().height, lineHeight: parseFloat(style.fontSize) * 2,
                overflow: el.scrollWidth - el.clientWidth};
    })""")
    assert any(b["text"] == "Purge queued" for b in buttons), buttons
    for button in buttons:
        assert button["lines"] == 1 and button["height"] < button["lineHeight"] + 8, button  # one line, not two
        assert button["overflow"] <= 1, button  # the label is inside the button


def test_api_docs_page_shows_the_authorization_header(page, live_server, operator_login):
    login(page, live_server, operator_login, next_path="/admin/")
    page.goto(f"{live_server}/api/v1/docs")
    page.wait_for_selector(".swagger-ui .info")
    shot(page, "api-docs")
    text = page.inner_text(".swagger-ui .info")
    assert "Authorization: Bearer <service token>" in text, text
