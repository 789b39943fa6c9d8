"""Issue 12: ``http.post`` checks the address a name resolves to, and connects to that address.

The handler runs in this process against real loopback listeners; only DNS is
stood in for (``socket.getaddrinfo`` for one made-up name), so a public-looking
allowed name can point at a loopback address the allow-list does not name
(127.0.0.2, like a metadata or admin address), or change its answer between
two lookups (DNS rebinding).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from django.test import override_settings

from tasks import registry
from tasks.errors import NonRetryableError
from tasks.execution import Context
from tests.support.helpers import unique
from tests.support.http_sink import SinkServer

NAME = "hooks.rebind.test"


def _ctx(url: str) -> Context:
    now = time.time()
    return Context(task_id=unique("t"), type="hook", lane="t-http", chat_id="", attempt=1, deadline=now + 30,
                   attempt_deadline=now + 10, idempotency_key=unique("k"), options={"url": url})


@pytest.fixture
def sink_and_victim():
    """A sink on 127.0.0.1:P and a listener counting accepts on 127.0.0.2:P (same port)."""
    with SinkServer() as sink:
        port = sink.server.server_address[1]
        victim = socket.socket()
        victim.bind(("127.0.0.2", port))
        victim.listen(8)
        accepted = []

        def loop():
            while True:
                try:
                    conn, _ = victim.accept()
                except OSError:
                    return
                accepted.append(1)
                conn.close()

        threading.Thread(target=loop, daemon=True).start()
        try:
            yield sink, port, accepted
        finally:
            victim.close()


@pytest.fixture
def dns(monkeypatch):
    """Answers for NAME, in order (the last repeats); other names resolve for real. Records each lookup."""
    real = socket.getaddrinfo
    answers: list[str] = []
    lookups: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != NAME:
            return real(host, port, *args, **kwargs)
        address = answers[min(len(lookups), len(answers) - 1)]
        lookups.append(address)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers, lookups


def test_an_allowed_name_resolving_to_an_unnamed_private_address_is_refused(sink_and_victim, dns):
    sink, port, accepted = sink_and_victim
    answers, _ = dns
    answers.append("127.0.0.2")
    post = registry.get("http.post").func
    with override_settings(DISPATCH_WEBHOOK_ALLOWED_HOSTS=[f"{NAME}:{port}"]):
        with pytest.raises(NonRetryableError, match="non-public"):
            post({"x": 1}, _ctx(f"http://{NAME}:{port}/hook"))
    assert accepted == [] and sink.sink.attempts == []


def test_the_request_goes_to_the_address_that_was_checked(sink_and_victim, dns):
    sink, port, accepted = sink_and_victim
    answers, lookups = dns
    answers.extend(["127.0.0.1", "127.0.0.2"])  # checked answer, then a rebinding one
    post = registry.get("http.post").func
    with override_settings(DISPATCH_WEBHOOK_ALLOWED_HOSTS=[f"{NAME}:{port}", f"127.0.0.1:{port}"]):
        assert post({"x": 1}, _ctx(f"http://{NAME}:{port}/hook")) == {"status": 200}
    assert lookups == ["127.0.0.1"]  # resolved once
    assert accepted == [] and len(sink.sink.attempts) == 1
    assert sink.sink.attempts[0].headers["Host"] == f"{NAME}:{port}"
