"""A simulated SMS supplier on loopback (seed 004's gateway): per-channel TPS, per-request latency.

``POST /submit`` with ``{"channel": "ch1", "messages": [{"key": ..., "to": "+86...", "text": ...}]}``
answers, after ``latency_ms``, one result per message in order: ``accepted`` (with a
``submit_id``), ``throttled`` (the channel's TPS bucket is empty: send it again
later) or ``rejected`` (a number that is not ``+`` and digits). A key it accepted
before is accepted again with the same ``submit_id`` and counted as a
duplicate, never submitted twice: a sender may re-send safely after any partial
failure. ``GET /stats`` returns the counts; ``GET /stats?prefix=P`` also counts the
accepted keys that start with ``P`` (``accepted_with_prefix``: one load step's messages).

Run it alone: ``python -m tools.sms_supplier --port 18123 --tps 500 --latency-ms 20``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass
class Supplier:
    #: Messages per second each channel accepts (its bucket holds one second's worth).
    tps: float = 500.0
    #: Milliseconds each request takes, whatever it carries.
    latency_ms: float = 20.0
    accepted: dict[str, str] = field(default_factory=dict)  # key -> submit id
    duplicates: int = 0
    throttled: int = 0
    rejected: int = 0
    requests: int = 0
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # channel -> (tokens, at)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def submit(self, channel: str, messages: list[dict]) -> list[dict]:
        time.sleep(self.latency_ms / 1000)
        results = []
        with self.lock:
            self.requests += 1
            now = time.monotonic()
            tokens, at = self._buckets.get(channel, (self.tps, now))
            tokens = min(self.tps, tokens + (now - at) * self.tps)
            for m in messages:
                key, to = str(m.get("key", "")), str(m.get("to", ""))
                if key in self.accepted:
                    self.duplicates += 1
                    results.append({"key": key, "status": "accepted", "submit_id": self.accepted[key]})
                elif not (to.startswith("+") and to[1:].isdigit()):
                    self.rejected += 1
                    results.append({"key": key, "status": "rejected", "error": f"invalid number {to!r}"})
                elif tokens < 1:
                    self.throttled += 1
                    results.append({"key": key, "status": "throttled"})
                else:
                    tokens -= 1
                    submit_id = self.accepted[key] = uuid.uuid4().hex
                    results.append({"key": key, "status": "accepted", "submit_id": submit_id})
            self._buckets[channel] = (tokens, now)
        return results

    def stats(self, prefix: str | None = None) -> dict:
        with self.lock:
            out = {"accepted": len(self.accepted), "duplicates": self.duplicates, "throttled": self.throttled,
                   "rejected": self.rejected, "requests": self.requests}
            if prefix is not None:
                out["accepted_with_prefix"] = sum(1 for key in self.accepted if key.startswith(prefix))
            return out


class _Handler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1, each answer in one write with Nagle off.

    A keep-alive connection whose answer went out as two writes (the headers, then
    the body) held the body until the client's delayed ACK of the headers: ~40 ms on
    Linux's loopback, twice the simulated latency. A real supplier's stack does not
    charge that; the simulator must not either.
    """

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    wbufsize = 64 * 1024

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            results = self.server.supplier.submit(str(body["channel"]), list(body["messages"]))  # type: ignore[attr-defined]
            self._answer(200, {"results": results})
        except (ValueError, KeyError, TypeError) as exc:
            self._answer(400, {"error": f"bad request: {exc!r}"})

    def do_GET(self) -> None:
        prefix = parse_qs(urlsplit(self.path).query).get("prefix")
        self._answer(200, self.server.supplier.stats(prefix[0] if prefix else None))  # type: ignore[attr-defined]

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)  # buffered (wbufsize): handle_one_request's flush sends headers and body at once

    def log_message(self, *args: object) -> None:
        pass


class SupplierServer:
    """The supplier on ``127.0.0.1:port`` (0: any free port), in a thread; a context manager."""

    def __init__(self, supplier: Supplier | None = None, port: int = 0) -> None:
        self.supplier = supplier or Supplier()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.supplier = self.supplier  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/submit"

    def __enter__(self) -> SupplierServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tps", type=float, default=500.0, help="messages per second per channel")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="milliseconds per request")
    opts = parser.parse_args()
    server = SupplierServer(Supplier(tps=opts.tps, latency_ms=opts.latency_ms), port=opts.port)
    print(f"sms supplier ready at {server.url}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
