"""Test-only counters of a grouping worker's main process, loaded in workers through
``DISPATCH_HOOK_MODULES=tests.support.runner_counts``: how many run-thread wake-ups the event loop asks for
as it hands messages to the group runner (``Runner.submit``), how many ack callbacks the runner sends to the
event loop (``Consumer.call_soon_ack``) for how many acks, and how many group finishes it makes
(``Runner._finish``) for how many tasks, and how many times the process parses a task's envelope or a test
payload (JSON text with ``"dispatched_at"``, or a ``"pmark"`` key). A thread writes them to a Redis hash per
process every 50 ms, where the test reads them. Counts, never times.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter

import orjson
from celery.worker.consumer.consumer import Consumer

from lanes import keys
from lanes import transport as lane_transport
from tasks import grouping

KEY = f"{keys.PREFIX}test:runner-counts"

_counts: Counter = Counter()
_lock = threading.Lock()
_in_submit = threading.local()
_started = False


def _add(name: str, n: int = 1) -> None:
    with _lock:
        _counts[name] += n


def _flush_forever() -> None:
    from lanes.redis_client import get_redis

    last: dict[str, int] = {}
    while True:
        time.sleep(0.05)
        with _lock:
            now = dict(_counts)
        if now != last:
            try:
                client = get_redis()
                client.hset(f"{KEY}:{os.getpid()}", mapping=now)
                client.expire(f"{KEY}:{os.getpid()}", 3600)
                last = now
            except Exception:  # noqa: BLE001 - the next turn writes them
                pass


def _start() -> None:
    global _started
    with _lock:
        if _started:
            return
        _started = True
    threading.Thread(target=_flush_forever, name="test-runner-counts", daemon=True).start()


_notify = threading.Condition.notify


def _counting_notify(self, n=1):
    if getattr(_in_submit, "on", False):
        _add("submit_notifies")
    if self._waiters and getattr(self, "_counted_runner", False):
        _add("wakeups", min(n, len(self._waiters)))
    return _notify(self, n)


_init = grouping.Runner.__init__


def _counting_init(self, consumer):
    _init(self, consumer)
    self._work._counted_runner = True
    self._work._runner = self


_wait = threading.Condition.wait


def _counting_wait(self, timeout=None):
    out = _wait(self, timeout)
    runner = getattr(self, "_runner", None)
    if runner is not None:
        useful = runner._ready or (not runner._calling and (runner._fresh or runner._pending))
        _add("woke_to_work" if useful else "woke_to_nothing")
    return out


_submit = grouping.Runner.submit


def _counting_submit(self, item):
    _start()
    _add("submits")
    _in_submit.on = True
    try:
        return _submit(self, item)
    finally:
        _in_submit.on = False


_finish = grouping.Runner._finish


def _counting_finish(self, done, replies, finished_at):
    _add("finish_calls")
    _add("finished_items", len(done))
    return _finish(self, done, replies, finished_at)


_call_soon_ack = Consumer.call_soon_ack


def _counting_call_soon_ack(self, p, *args, **kwargs):
    _add("ack_callbacks")
    return _call_soon_ack(self, p, *args, **kwargs)


_qos_ack = lane_transport.QoS.ack


def _counting_qos_ack(self, delivery_tag):
    _add("acks")
    return _qos_ack(self, delivery_tag)


_take = lane_transport.Channel._take


def _counting_take(self, lane, bits):
    taken = _take(self, lane, bits)
    if taken:
        _add("pops")
    return taken


_orjson_loads, _json_loads = orjson.loads, json.loads


def _counted_parse(text) -> None:
    """A parse of text holding a task's envelope (its ``dispatched_at`` field) or a test payload's marker."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", "replace")
    if isinstance(text, str):
        if '"dispatched_at"' in text:
            _add("envelope_parses")
        if '"pmark"' in text:
            _add("payload_parses")


def _counting_orjson_loads(text):
    _counted_parse(text)
    return _orjson_loads(text)


def _counting_json_loads(text, *args, **kwargs):
    _counted_parse(text)
    return _json_loads(text, *args, **kwargs)


orjson.loads = _counting_orjson_loads
json.loads = _counting_json_loads
threading.Condition.notify = _counting_notify  # type: ignore[method-assign]
threading.Condition.wait = _counting_wait  # type: ignore[method-assign]
grouping.Runner.__init__ = _counting_init  # type: ignore[method-assign]
grouping.Runner.submit = _counting_submit  # type: ignore[method-assign]
grouping.Runner._finish = _counting_finish  # type: ignore[method-assign]
Consumer.call_soon_ack = _counting_call_soon_ack  # type: ignore[method-assign]
lane_transport.QoS.ack = _counting_qos_ack  # type: ignore[method-assign]
lane_transport.Channel._take = _counting_take  # type: ignore[method-assign]


def read(client, pid: int) -> Counter:
    """The counts a worker process wrote last (its pid)."""
    return Counter({k.decode(): int(v) for k, v in client.hgetall(f"{KEY}:{pid}").items()})
