"""Issue 12: ``http.post`` reaches only what the allow-list names, keeps credentials
out of errors, and reads a bounded part of an answer.

Real loopback listeners and a real worker whose allow-list is
``localhost`` (port 80 only), ``localhost:<allowed sink>`` and
``localhost:<huge-answer server>``; other listeners count the connections
they accept, so a refused URL is proven not to have connected anywhere.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings

from lanes.config_version import bump_config_version
from tasks.dispatch import dispatch
from tasks.models import DeadLetter, TaskType
from tests.support.helpers import define, unique, wait_until
from tests.support.http_sink import SinkServer
from tests.support.workers import Worker

LANE = "t-webhook-sec"
HUGE_BYTES = 64 * 1024 * 1024


class AcceptCounter:
    """A loopback listener that only counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


class _Huge(BaseHTTPRequestHandler):
    sent = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", str(HUGE_BYTES))
        self.end_headers()
        chunk = b"x" * 65536
        try:
            for _ in range(HUGE_BYTES // len(chunk)):
                self.wfile.write(chunk)
                type(self).sent += len(chunk)
        except OSError:
            pass  # the client stopped reading and closed: what this test wants

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def net(tmp_root):
    """Listeners, the allow-list naming some of them, and a worker using that allow-list."""
    with SinkServer() as allowed, SinkServer() as unnamed:
        victim = AcceptCounter()
        huge = ThreadingHTTPServer(("127.0.0.1", 0), _Huge)
        huge.daemon_threads = True
        threading.Thread(target=huge.serve_forever, daemon=True).start()
        a_port, h_port = allowed.server.server_address[1], huge.server_address[1]
        allow = ["localhost", f"localhost:{a_port}", f"localhost:{h_port}"]
        worker = Worker(LANE, tmp_root / "logs", concurrency=1,
                        env={"DISPATCH_WEBHOOK_ALLOWED_HOSTS": ",".join(allow)}).start()
        try:
            with override_settings(DISPATCH_WEBHOOK_ALLOWED_HOSTS=allow):
                yield {"allowed": allowed, "unnamed": unnamed, "victim": victim, "worker": worker,
                       "allowed_url": f"http://localhost:{a_port}/hook", "huge_url": f"http://localhost:{h_port}/big"}
        finally:
            worker.retire()
            huge.shutdown()
            huge.server_close()
            victim.close()


def _type_with_url(net, url: str) -> TaskType:
    """A type saved with an allowed URL, then given ``url`` behind validation's back (as raw SQL would)."""
    name = unique("hook-sec")
    tt = define(name, handler="http.post", lane=LANE, options={"url": net["allowed_url"]},
                policy={"max_retries": 0})
    TaskType.objects.filter(pk=tt.pk).update(options={"url": url})
    bump_config_version()
    return tt


def _refused_at_save(net, url: str) -> str:
    tt = define(unique("hook-save"), handler="http.post", lane=LANE, options={"url": net["allowed_url"]})
    tt.options = {"url": url}
    with pytest.raises(ValidationError) as err:
        tt.full_clean()
    assert "options" in err.value.message_dict
    return " ".join(err.value.message_dict["options"])


def _dead_letter_of(name: str, payload: dict | None = None) -> DeadLetter:
    result = dispatch.delay(name, payload or {"x": 1})
    assert result.accepted, result.reason
    with pytest.raises(Exception, match="non_retryable"):
        result.get(timeout=30)
    return DeadLetter.objects.get(task_id=result.task_id)


def test_backslash_url_is_refused_at_save_and_at_execution_and_connects_nowhere(net):
    victim = net["victim"]
    url = f"http://127.0.0.1:{victim.port}\\@localhost/hook"
    message = _refused_at_save(net, url)
    assert "\\" in message
    tt = _type_with_url(net, url)
    row = _dead_letter_of(tt.name)
    assert "\\" in row.error_message
    assert victim.accepted == 0


def test_a_port_the_allow_list_does_not_name_is_refused(net):
    unnamed = net["unnamed"]
    url = f"http://localhost:{unnamed.server.server_address[1]}/hook"  # "localhost" alone means port 80
    assert "not allowed" in _refused_at_save(net, url)
    tt = _type_with_url(net, url)
    assert "not allowed" in _dead_letter_of(tt.name).error_message
    assert unnamed.sink.attempts == []


def test_a_named_host_and_port_is_delivered_to_that_host(net):
    name = unique("hook-ok")
    define(name, handler="http.post", lane=LANE, options={"url": net["allowed_url"]})
    key = unique("k")
    assert dispatch.delay(name, {"n": 1}, idempotency_key=key).get(timeout=30) == {"status": 200}
    (attempt,) = net["allowed"].sink.attempts_for(key)
    port = net["allowed"].server.server_address[1]
    assert attempt.headers["Host"] == f"localhost:{port}"


def test_credentials_in_the_url_are_refused_and_never_shown(net):
    port = net["allowed"].server.server_address[1]
    url = f"http://hookuser:s3cret-pw@localhost:{port}/hook"
    message = _refused_at_save(net, url)
    assert "credentials" in message and "s3cret-pw" not in message and "hookuser" not in message
    tt = _type_with_url(net, url)
    row = _dead_letter_of(tt.name)
    assert "credentials" in row.error_message and "s3cret-pw" not in row.error_message
    assert "s3cret-pw" not in net["worker"].log_path.read_text(errors="replace")


def test_query_secrets_are_redacted_from_error_messages(net):
    name = unique("hook-q")
    define(name, handler="http.post", lane=LANE, options={"url": net["allowed_url"] + "?token=q-s3cret-tok"},
           policy={"max_retries": 0})
    row = _dead_letter_of(name, {"sink_status": 404})
    assert "answered 404" in row.error_message and "token=***" in row.error_message
    assert "q-s3cret-tok" not in row.error_message
    assert "q-s3cret-tok" not in net["worker"].log_path.read_text(errors="replace")


def test_a_huge_answer_is_read_only_in_part_and_the_result_says_so(net):
    name = unique("hook-huge")
    define(name, handler="http.post", lane=LANE, options={"url": net["huge_url"]})
    _Huge.sent = 0
    result = dispatch.delay(name, {"n": 1}).get(timeout=60)
    assert result == {"status": 200, "body_truncated": True, "body_bytes_read": 64 * 1024}
    # The worker closed the connection instead of reading 64 MiB: the server could not send it all.
    wait_until(lambda: _Huge.sent < HUGE_BYTES, timeout=5, what="server stopped sending")
    assert _Huge.sent < HUGE_BYTES
