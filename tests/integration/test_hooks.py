"""Lifecycle signals with real workers: the right events, attempts and latencies.

Worker-side receivers come from ``DISPATCH_HOOK_MODULES`` (a raising module
first, then a recorder writing to Redis); caller-side ones are connected here.
Latency checks are bounds that follow from when the test did things (a worker
started later, a handler sleeping, a retry delay), never speed expectations.
"""

from __future__ import annotations

import time

import pytest

from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until

HOOK_ENV = {"DISPATCH_HOOK_MODULES": "tests.support.hook_raiser,tests.support.hook_recorder"}


@pytest.fixture
def caller_hooks():
    """The raiser then the recorder, connected in this (the caller's) process for the test."""
    from tests.support import hook_raiser, hook_recorder

    hook_raiser.connect()
    hook_recorder.connect()
    yield hook_recorder
    hook_recorder.disconnect()
    hook_raiser.disconnect()


@pytest.fixture(scope="module")
def hook_lane(tmp_root):
    from tests.support.workers import Worker

    lane = unique("hooks")
    worker = Worker(lane, tmp_root / "logs", concurrency=2, env=HOOK_ENV).start()
    yield lane, worker
    worker.retire()


def _events(rc, type_name: str, count: int) -> list[dict]:
    from tests.support.hook_recorder import read_events

    return wait_until(lambda: (ev := read_events(rc, type_name)) and len(ev) >= count and ev,
                      timeout=30, what=f"{count} hook events of {type_name}")


def _by(events: list[dict], signal: str, attempt: int | None = None) -> dict:
    found = [e for e in events if e["signal"] == signal and (attempt is None or e["attempt"] == attempt)]
    assert len(found) == 1, (signal, attempt, events)
    return found[0]


def test_success_and_expiry_carry_queue_and_execution_latency(rc, start_worker, caller_hooks):
    lane = unique("hooks-late")
    ok_type, late_type = unique("hk-ok"), unique("hk-late")
    define(ok_type, lane=lane)
    define(late_type, lane=lane)
    t0 = time.time()
    ok = dispatch.delay(ok_type, {"sleep": 0.3})
    late = dispatch.delay(late_type, {}, timeout=0.5)
    t1 = time.time()
    assert ok.accepted and late.accepted  # the raising caller-side receiver broke nothing
    time.sleep(1.0)  # no worker serves the lane yet: both wait
    before_worker = time.time()
    worker = start_worker(lane, concurrency=1, env=HOOK_ENV)
    assert ok.get(timeout=30) == {"sleep": 0.3}

    events = _events(rc, ok_type, 3)
    queued, started, finished = _by(events, "queued"), _by(events, "started"), _by(events, "finished")
    assert queued["task_id"] == started["task_id"] == finished["task_id"] == ok.task_id
    assert queued["lane"] == lane and queued["queue_latency_s"] is None
    assert started["attempt"] == finished["attempt"] == 1
    # It cannot start before its worker existed, nor after its own finish was recorded.
    assert before_worker - t1 <= started["queue_latency_s"] <= finished["at"] - t0
    assert finished["queue_latency_s"] == started["queue_latency_s"]
    assert finished["outcome"] == "succeeded" and finished["reason"] == ""
    assert 0.3 <= finished["execution_latency_s"] <= finished["at"] - t0 - started["queue_latency_s"]
    assert started["pid"] != queued["pid"]  # started/finished fired in the worker

    # The short-deadline task dies as expired before running: no started event, no execution latency.
    late_events = _events(rc, late_type, 2)
    assert [e["signal"] for e in late_events] == ["queued", "finished"]
    dead = late_events[1]
    assert dead["outcome"] == "dead" and dead["reason"] == "expired" and dead["execution_latency_s"] is None
    assert dead["queue_latency_s"] >= before_worker - t1
    assert "hook_receiver_failed" in worker.log_text()  # the raiser raised in the worker, and was only logged


def test_retry_then_success_reports_each_attempt(rc, hook_lane):
    lane, _worker = hook_lane
    name = unique("hk-retry")
    define(name, handler="demo.flaky", lane=lane, policy={"max_retries": 3, "initial_backoff": 0.05, "jitter": 0})
    t0 = time.time()
    result = dispatch.delay(name, {"fail": "retry", "fail_times": 1, "retry_after": 0.5})
    assert result.get(timeout=30)["fail"] == "retry"
    events = _events(rc, name, 4)
    assert [(e["signal"], e["attempt"]) for e in events] == [
        ("started", 1), ("finished", 1), ("started", 2), ("finished", 2)]
    first, retrying = _by(events, "started", 1), _by(events, "finished", 1)
    second, done = _by(events, "started", 2), _by(events, "finished", 2)
    assert retrying["outcome"] == "retrying" and retrying["reason"] == "RetryableError"
    assert "asked to fail attempt 1" in retrying["detail"]
    assert retrying["execution_latency_s"] >= 0
    # Queue latency counts from the dispatch: the second attempt waited for the first and the 0.5 s retry delay.
    assert second["queue_latency_s"] >= first["queue_latency_s"] + retrying["execution_latency_s"] + 0.5
    assert second["queue_latency_s"] <= done["at"] - t0
    assert done["outcome"] == "succeeded" and done["queue_latency_s"] == second["queue_latency_s"]
    assert rc.hget("dispatch:m:total", f"retried|{lane}|{name}|1") == b"1"


def test_dead_task_reports_reason_and_execution_latency(rc, hook_lane):
    lane, _worker = hook_lane
    name = unique("hk-dead")
    define(name, handler="demo.flaky", lane=lane)
    t0 = time.time()
    result = dispatch.delay(name, {"fail": "fatal", "sleep": 0.2})
    with pytest.raises(Exception, match="non_retryable"):
        result.get(timeout=30)
    events = _events(rc, name, 2)
    started, finished = _by(events, "started"), _by(events, "finished")
    assert finished["outcome"] == "dead" and finished["reason"] == "non_retryable"
    assert "asked to fail for good" in finished["detail"]
    assert finished["attempt"] == 1 and finished["task_id"] == result.task_id
    assert 0.2 <= finished["execution_latency_s"] <= finished["at"] - t0 - started["queue_latency_s"]


def test_rejections_fire_in_the_caller_and_a_raising_receiver_breaks_nothing(rc, caller_hooks):
    from lanes.models import Lane

    lane = unique("hooks-rej")
    name = unique("hk-rej")
    define(name, lane=lane)
    bad = dispatch.delay(name, ["not", "an", "object"])
    assert not bad.accepted and bad.reason == "invalid_payload"
    Lane.objects.filter(name=lane).update(accepting=False)
    from lanes.config_version import bump_config_version

    bump_config_version()
    closed = dispatch.delay(name, {"x": 1})
    assert not closed.accepted and closed.reason == "lane_closed"
    events = _events(rc, name, 2)
    assert [(e["signal"], e["reason"]) for e in events] == [("rejected", "invalid_payload"),
                                                            ("rejected", "lane_closed")]
    for event in events:
        assert event["task_id"] is None and event["lane"] == lane and event["type"] == name
        assert event["queue_latency_s"] is None and event["execution_latency_s"] is None
        assert event["detail"]
