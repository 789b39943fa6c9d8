"""A loopback HTTP server that records every attempt it receives, for delivery tests.

Behaviour is set per test: a delay range, a status to answer for the first N
attempts of each idempotency key, or a fraction of first attempts to fail.
It tracks, per chat, the order of applied sequences and whether two requests
of one chat were ever in flight at once.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


@dataclass
class Attempt:
    key: str
    chat: str
    attempt: int
    headers: dict
    body: dict
    status: int
    at: float
    started: float = 0.0  # when the request reached the sink (``at`` is when it answered)


@dataclass
class SinkBehaviour:
    delay_s: tuple[float, float] = (0.0, 0.0)
    fail_first: int = 0  # answer fail_status to the first N attempts of each key
    fail_status: int = 500
    fail_fraction_first: float = 0.0  # fraction of keys whose first attempt fails
    retry_after: str | None = None
    always_status: int | None = None


@dataclass
class Sink:
    behaviour: SinkBehaviour = field(default_factory=SinkBehaviour)
    attempts: list[Attempt] = field(default_factory=list)
    applied: dict[str, int] = field(default_factory=dict)  # key -> times applied (dedupes on key)
    order: dict[str, list] = field(default_factory=dict)  # chat -> applied seqs
    overlaps: list[str] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen_keys: dict[str, int] = field(default_factory=dict)

    def handle(self, headers: dict, body: dict) -> tuple[int, dict]:
        started = time.time()
        key = unquote(headers.get("Idempotency-Key", ""))
        chat = unquote(headers.get("X-Dispatch-Chat-Id", ""))
        b = self.behaviour
        with self.lock:
            n = self.seen_keys[key] = self.seen_keys.get(key, 0) + 1
            # Requests without a chat are counted under "" (in flight, not overlaps).
            self.in_flight[chat] = self.in_flight.get(chat, 0) + 1
            if chat and self.in_flight[chat] > 1:
                self.overlaps.append(chat)
        try:
            # A payload may ask for its own behaviour: sink_delay_s, sink_status (always),
            # sink_fail_first (503 to its first N attempts) and sink_retry_after.
            low, high = b.delay_s
            own_delay = body.get("sink_delay_s")
            if isinstance(own_delay, (int, float)):
                time.sleep(own_delay)
            elif high > 0:
                time.sleep(random.uniform(low, high))
            status = 200
            retry_after = b.retry_after
            if isinstance(body.get("sink_status"), int):
                status = body["sink_status"]
            elif isinstance(body.get("sink_fail_first"), int) and n <= body["sink_fail_first"]:
                status = 503
                retry_after = body.get("sink_retry_after") or retry_after
            elif b.always_status is not None:
                status = b.always_status
            elif n <= b.fail_first:
                status = b.fail_status
            elif n == 1 and b.fail_fraction_first and random.random() < b.fail_fraction_first:
                status = b.fail_status
            with self.lock:
                self.attempts.append(Attempt(key, chat, int(headers.get("X-Dispatch-Attempt", "0") or 0),
                                             headers, body, status, time.time(), started))
                if status == 200 and key not in self.applied:
                    self.order.setdefault(chat, []).append(body.get("seq"))
                if status == 200:
                    self.applied[key] = self.applied.get(key, 0) + 1
            extra = {"Retry-After": str(retry_after)} if retry_after and status != 200 else {}
            return status, extra
        finally:
            with self.lock:
                self.in_flight[chat] -= 1

    def attempts_for(self, key: str) -> list[Attempt]:
        with self.lock:
            return [a for a in self.attempts if a.key == key]


class _Handler(BaseHTTPRequestHandler):
    sink: Sink

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {"_raw": raw.decode(errors="replace")}
        status, extra = self.server.sink.handle(dict(self.headers), body)
        self.send_response(status)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


class _Server(ThreadingHTTPServer):
    """Room for every connection the workers open at once (socketserver's default backlog is 5).

    The handler answers HTTP/1.0, so each request is a new connection. A full backlog (the accept
    thread waiting for a CPU) makes Linux drop the SYN, and the caller retries only after TCP's
    1 s timeout: a stall of the sink that a test timing the starts would blame on the platform.
    """

    request_queue_size = 256
    sink: Sink


class SinkServer:
    def __init__(self, behaviour: SinkBehaviour | None = None) -> None:
        self.sink = Sink(behaviour or SinkBehaviour())
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.sink = self.sink
        # Polled every 50 ms (the default 0.5 s is what each test's teardown would wait in shutdown()).
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> SinkServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
