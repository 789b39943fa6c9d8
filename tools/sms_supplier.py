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
import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
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
        """One request's answer after its latency (blocking: for a caller without the server)."""
        time.sleep(self.latency_ms / 1000)
        return self.decide(channel, messages)

    def decide(self, channel: str, messages: list[dict]) -> list[dict]:
        """One result per message, in order: accepted (a known key: its same submit id), throttled or rejected."""
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


#: Most bytes of one request's line and headers (a request past it is answered 400 and its connection closed).
MAX_HEAD = 16 * 1024
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


class SupplierServer:
    """The supplier on ``127.0.0.1:port`` (0: any free port), served by one asyncio loop; a context manager.

    Keep-alive HTTP/1.1, each answer in one write (asyncio's TCP transports have Nagle off). One loop
    thread, no thread per connection: a request is a few dozen microseconds of Python and its
    simulated latency an ``asyncio.sleep``. The thread-per-connection ``http.server`` it replaces cost
    0.31-0.42 ms of CPU a request (BENCHMARKS.md, *SMS demo stepped on PostgreSQL*), CPU that
    ``smsload`` took from the platform it measures on the same two cores; a real supplier's is not
    on them. (Before that, its answers went out in two writes on a Nagle socket: the body waited
    ~40 ms for the client's delayed ACK of the headers.)
    """

    def __init__(self, supplier: Supplier | None = None, port: int = 0) -> None:
        self.supplier = supplier or Supplier()
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", port))
        self.port = int(self.server.sockets[0].getsockname()[1])
        self.thread = threading.Thread(target=self.serve_forever, name="sms-supplier", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/submit"

    def serve_forever(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def __enter__(self) -> SupplierServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            self.server.close()
            connections = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in connections:
                task.cancel()
            await asyncio.gather(*connections, return_exceptions=True)
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(close(), self.loop)
        self.thread.join(timeout=10)
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: its requests in turn, each answered in one write, until the client closes it."""
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    writer.write(_answer(400, {"error": "request head too large"}))
                    return
                method, target, headers = _parse_head(head)
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                status, answer = await self._route(method, target, body)
                writer.write(_answer(status, answer))
                if headers.get("connection", "").lower() == "close":
                    await writer.drain()
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return
        finally:
            writer.close()

    async def _route(self, method: str, target: str, body: bytes) -> tuple[int, dict]:
        parts = urlsplit(target)
        if method == "POST" and parts.path == "/submit":
            try:
                request = json.loads(body or b"{}")
                channel, messages = str(request["channel"]), list(request["messages"])
                if not all(isinstance(m, dict) for m in messages):
                    raise TypeError("each message must be an object")
            except (ValueError, KeyError, TypeError) as exc:
                return 400, {"error": f"bad request: {exc!r}"}
            await asyncio.sleep(self.supplier.latency_ms / 1000)
            return 200, {"results": self.supplier.decide(channel, messages)}
        if method == "GET" and parts.path == "/stats":
            prefix = parse_qs(parts.query).get("prefix")
            return 200, self.supplier.stats(prefix[0] if prefix else None)
        return (405 if parts.path in ("/submit", "/stats") else 404), {"error": f"no {method} {parts.path}"}


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """``(method, target, headers)`` of a request's head; header names lower-cased."""
    if len(head) > MAX_HEAD:
        raise ValueError("request head too large")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, target, headers


def _answer(status: int, body: dict) -> bytes:
    """The whole answer, head and body, as one buffer (one write)."""
    data = json.dumps(body).encode()
    return (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tps", type=float, default=500.0, help="messages per second per channel")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="milliseconds per request")
    opts = parser.parse_args()
    server = SupplierServer(Supplier(tps=opts.tps, latency_ms=opts.latency_ms), port=opts.port)
    print(f"sms supplier ready at {server.url}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
