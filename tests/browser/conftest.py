"""Browser fixtures: the site served from this process, and Debian's Chromium driven by Playwright.

Playwright cannot download its own browser here, so it launches the system
Chromium (``apt-get install -y chromium``); without it these tests are skipped
with that instruction.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def live_server() -> Iterator[str]:
    """The Django site (with the admin's static files) on a free loopback port, in a thread."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.wsgi import get_wsgi_application

    server = make_server("127.0.0.1", 0, StaticFilesHandler(get_wsgi_application()),
                         server_class=_ThreadingServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="live-server", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


BROWSER_DIR = Path(__file__).resolve().parent
#: The tier's one Chromium (and Playwright's driver), launched by the first browser test and closed after
#: the last one: about a second of launch a module otherwise (the browser keeps no state between tests:
#: each has its own context).
_shared: dict = {}


def _in_tier(item) -> bool:
    return item is not None and BROWSER_DIR in Path(str(item.fspath)).resolve().parents


def _close_browser() -> None:
    if "previous" not in _shared:
        return
    try:
        if "browser" in _shared:
            _shared.pop("browser").close()
    finally:
        if "playwright" in _shared:
            _shared.pop("playwright").__exit__(None, None, None)
        previous = _shared.pop("previous")
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The tier's last test closes the browser: Playwright's event loop stays out of the other tiers."""
    if _in_tier(item) and not _in_tier(nextitem):
        _close_browser()


def pytest_sessionfinish(session, exitstatus):
    _close_browser()


@pytest.fixture
def browser():
    if not os.path.exists(CHROMIUM):
        message = f"browser tests need Chromium at {CHROMIUM}: apt-get install -y chromium (or set CHROMIUM_PATH)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: missing there is a broken setup, not a skip
        pytest.skip(message)
    if "browser" not in _shared:
        from playwright.sync_api import sync_playwright

        # Playwright's sync API keeps an asyncio loop in this thread; Django would then
        # refuse the test's own ORM calls. Nothing else runs on that loop: allow them
        # while the browser is open (the browser tier).
        _shared["previous"] = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
        from tests.conftest import OUTLIVE_MODULE
        from tests.support.leftovers import descendants

        before = set(descendants(os.getpid()))
        manager = sync_playwright()
        playwright = manager.__enter__()
        _shared["playwright"] = manager
        _shared["browser"] = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # The tier's one Chromium (and Playwright's driver) outlives the module that launched it.
        OUTLIVE_MODULE.update(set(descendants(os.getpid())) - before)
    return _shared["browser"]


#: Reports every Content-Security-Policy violation of every page the context opens to Python.
_CSP_LISTENER = """
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolation([e.violatedDirective, e.blockedURI, e.sourceFile + ":" + e.lineNumber].join(" "));
});
"""


def watch_csp(context) -> list[str]:
    """Collect CSP violations (the DOM event, and Chromium's console report) of every page of ``context``."""
    violations: list[str] = []
    context.expose_binding("__cspViolation", lambda source, text: violations.append(f"{source['page'].url}: {text}"))
    context.add_init_script(_CSP_LISTENER)

    def on_console(message) -> None:
        if "Content Security Policy" in message.text:
            violations.append(f"console: {message.text}")

    context.on("console", on_console)
    return violations


@pytest.fixture
def page(browser, request):
    """A fresh browser context per test; a screenshot of where it ended is kept as an artifact.

    The test fails if any page it opened reported a Content-Security-Policy violation.
    """
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    context.set_default_timeout(20_000)
    violations = watch_csp(context)
    tab = context.new_page()
    yield tab
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        tab.screenshot(path=str(ARTIFACTS / f"{request.node.name}-end.png"), full_page=True)
    finally:
        context.close()
    assert not violations, "Content-Security-Policy violations:\n" + "\n".join(violations)


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture
def operator_login():
    """A superuser with a real password, for logging in through the form."""
    from django.contrib.auth import get_user_model

    from tests.support.helpers import unique

    name, password = unique("op"), "pw-browser-123"
    get_user_model().objects.create_superuser(name, f"{name}@example.com", password)
    return name, password
