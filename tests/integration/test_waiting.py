"""Deadlines hold while a task waits, honest ``estimated_delay``, and upkeep that sends no task messages.

Issue 13: a lane without a worker kept its tasks past their deadline; the
estimate read tens of seconds on an idle lane and 0.0 on a paused one; beat
sent ``tasks.maintenance`` every two seconds, flooding Flower and the log.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time

import pytest
from django_celery_results.models import TaskResult

from lanes import keys
from tasks.dispatch import dispatch
from tasks.errors import DeadLettered
from tasks.models import DeadLetter
from tests.support.helpers import define, lane_depth, unique, wait_until
from tests.support.workers import CELERY, ROOT

HOOK_ENV = {"DISPATCH_HOOK_MODULES": "tests.support.hook_recorder"}


def dead_letter(task_id: str, timeout: float = 20.0) -> DeadLetter:
    return wait_until(lambda: DeadLetter.objects.filter(task_id=task_id).first(), timeout=timeout,
                      interval=0.1, what=f"dead letter of {task_id}")


def lane_copies(rc, lane: str) -> list[bytes]:
    return [m for q in keys.lane_queues(lane) for m in rc.lrange(q, 0, -1)]


def test_queued_task_with_no_consumer_expires_at_its_deadline(start_worker, rc):
    """Maintenance in a worker of *another* lane expires it: row, FAILURE result, get() raises."""
    name, lane = unique("nocons"), unique("l-nocons")
    define(name, lane=lane)
    start_worker(unique("l-elsewhere"), pool="threads", concurrency=1)
    dispatched_at = time.time()
    result = dispatch.delay(name, {"x": 1}, timeout=2.0)
    assert result.accepted
    record = keys.task_record(result.task_id)
    assert lane_depth(rc, lane) == 1

    row = dead_letter(result.task_id)
    assert row.reason == "expired" and row.payload == {"x": 1} and row.lane == lane
    assert row.died_at.timestamp() >= dispatched_at + 2.0  # at its deadline, not before
    with pytest.raises(DeadLettered, match="expired"):
        result.get(timeout=10)
    assert TaskResult.objects.get(task_id=result.task_id).status == "FAILURE"
    # It left the lane, and Redis holds nothing of it but the short tombstone.
    wait_until(lambda: not rc.exists(record) and rc.zscore(keys.EXPIRED_PENDING, record) is None,
               what="the expired record settled")
    assert lane_depth(rc, lane) == 0
    assert rc.zscore(keys.DEADLINES, record) is None and rc.zscore(keys.LEASES, record) is None


def test_chat_head_and_middle_expire_and_the_chat_moves_on_in_order(start_worker, sink, rc):
    name, lane = unique("chatexp"), unique("l-chatexp")
    define(name, handler="http.post", lane=lane, chat_scoped=True, chat_queue_size=16,
           options={"url": sink.url}, timeout=60)
    start_worker(unique("l-elsewhere"), pool="threads", concurrency=1)  # maintenance only
    chat = unique("c")
    sent = {}
    for label, timeout in (("head", 2.0), ("a", 60), ("middle", 2.0), ("b", 60)):
        sent[label] = dispatch.delay(name, {"seq": label}, chat_id=chat, timeout=timeout,
                                     idempotency_key=f"{chat}-{label}")
        assert sent[label].accepted
    head_copy = lane_copies(rc, lane)
    assert len(head_copy) == 1  # only the head is published
    assert int(rc.get(keys.lane_chat_waiting(lane))) == 3

    for label in ("head", "middle"):
        assert dead_letter(sent[label].task_id).reason == "expired"
        with pytest.raises(DeadLettered):
            sent[label].get(timeout=10)
    # The head handed the chat to "a" (published); "middle" left the chat queue; "b" still waits.
    wait_until(lambda: len(lane_copies(rc, lane)) == 1 and lane_copies(rc, lane) != head_copy,
               what="the next message published")
    assert [t.decode() for t in rc.lrange(keys.chat_queue(chat), 0, -1)] == [sent["a"].task_id, sent["b"].task_id]
    assert int(rc.get(keys.lane_chat_waiting(lane))) == 1
    # A copy of the expired head that the expiry could not take back (e.g. a republished
    # one) is popped later by a worker: it must not run.
    rc.rpush(keys.lane_queue(lane, 0), head_copy[0])

    start_worker(lane, pool="threads", concurrency=2)
    assert sent["a"].get(timeout=30) == {"status": 200}
    assert sent["b"].get(timeout=30) == {"status": 200}
    wait_until(lambda: lane_depth(rc, lane) == 0, what="the stale copy consumed")
    time.sleep(0.5)
    assert sink.sink.order[chat] == ["a", "b"]
    assert sink.sink.attempts_for(f"{chat}-head") == [] and sink.sink.attempts_for(f"{chat}-middle") == []
    wait_until(lambda: not rc.exists(keys.chat_queue(chat)), what="the chat left no queue")
    assert not rc.exists(keys.lane_chat_waiting(lane))


# --- estimated_delay ---------------------------------------------------------------

def _started_events(rc, type_name: str) -> dict[str, float]:
    from tests.support.hook_recorder import read_events

    return {e["task_id"]: e["queue_latency_s"] for e in read_events(rc, type_name) if e["signal"] == "started"}


def test_estimated_delay_follows_observed_waits(start_worker, rc):
    """Bursts on a one-slot worker: estimates within 3x + 0.5 s of the real waits; ~0 when idle.

    The factor: each estimate and the queue wait the worker measured for that
    task (hook ``started``) agree within ``3 * other + 0.5`` seconds, for 90% of
    the tasks and for the means.
    """
    name, chat_name, lane = unique("est"), unique("est-chat"), unique("l-est")
    define(name, lane=lane)
    define(chat_name, lane=lane, chat_scoped=True, chat_queue_size=16)
    start_worker(lane, pool="threads", concurrency=1, env=HOOK_ENV)
    for i in range(5):  # warm-up: the lane has measured completions
        dispatch.delay(name, {"sleep": 0.1, "warm": i}).get(timeout=30)

    # Idle lane: nothing ahead, nothing waits.
    idle = dispatch.delay(name, {"idle": 1})
    assert idle.estimated_delay is not None and idle.estimated_delay < 0.05
    idle.get(timeout=30)
    # Almost idle, a chat's second message: it waits for the first (0.1 s), not for tens of seconds.
    chat = unique("c")
    first = dispatch.delay(chat_name, {"sleep": 0.1}, chat_id=chat)
    second = dispatch.delay(chat_name, {"sleep": 0.1}, chat_id=chat)
    assert second.position == 2 and second.estimated_delay is not None and second.estimated_delay <= 1.0, second
    first.get(timeout=30)
    second.get(timeout=30)

    estimates: dict[str, float] = {}
    for _burst in range(6):
        for i in range(4):
            r = dispatch.delay(name, {"sleep": 0.15, "i": i})
            assert r.estimated_delay is not None, r
            estimates[r.task_id] = r.estimated_delay
        time.sleep(1.0)
    waits = wait_until(lambda: (ev := _started_events(rc, name)) and set(estimates) <= set(ev) and ev,
                       timeout=60, what="every burst task started")
    pairs = [(estimates[t], waits[t]) for t in estimates]

    def close(a: float, b: float) -> bool:
        return a <= 3 * b + 0.5 and b <= 3 * a + 0.5

    good = sum(close(e, w) for e, w in pairs)
    assert good >= 0.9 * len(pairs), pairs
    mean_e, mean_w = statistics.mean(e for e, _ in pairs), statistics.mean(w for _, w in pairs)
    assert close(mean_e, mean_w), (mean_e, mean_w, pairs)
    assert max(w for _, w in pairs) > 0.2  # the bursts did queue: the check compared real waits


def test_estimated_delay_is_none_with_a_reason_on_a_paused_lane(rc):
    name, lane = unique("est-paused"), unique("l-est-paused")
    define(name, lane=lane)
    rc.sadd(keys.PAUSED_LANES, lane)
    try:
        result = dispatch.delay(name, {"x": 1})
    finally:
        rc.srem(keys.PAUSED_LANES, lane)
    assert result.accepted and result.estimated_delay is None
    assert "paused" in result.detail and lane in result.detail


# --- beat sends no maintenance message ----------------------------------------------

def test_beat_sends_no_maintenance_message_and_still_expires_waiting_tasks(tmp_root, rc):
    """Only beat runs (no worker at all): nothing reaches the broker's ingress queue, and a
    waiting task still expires (beat's own maintenance thread), counted in the loop's metric."""
    name, lane = unique("beat"), unique("l-beat")
    define(name, lane=lane)
    ingress = keys.lane_queues("ingress")
    before = {q: rc.llen(q) for q in ingress}
    result = dispatch.delay(name, {"x": 1}, timeout=1.0)
    started_at = time.time()
    log = (tmp_root / "logs" / f"beat-{unique('b')}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        beat = subprocess.Popen(
            [CELERY, "-A", "dispatchsite", "beat", "-s", str(tmp_root / f"schedule-{unique('s')}"), "-l", "INFO",
             "--pidfile="],
            cwd=ROOT, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: b"beat: Starting" in log.read_bytes(), timeout=60, what="beat started")
        beat_at = time.monotonic()
        row = dead_letter(result.task_id, timeout=30)  # within the watch below, not after it
        assert row.reason == "expired"
        # Past the old 2 s period, by which beat had sent its first maintenance message (one is the regression).
        time.sleep(max(0.0, beat_at + 3.0 - time.monotonic()))
        assert beat.poll() is None, log.read_text(errors="replace")
        sent = [json.loads(m)["headers"]["task"]
                for q in ingress for m in rc.lrange(q, 0, rc.llen(q) - before[q] - 1)]
        assert "tasks.maintenance" not in sent, sent
    finally:
        beat.send_signal(signal.SIGTERM)
        try:
            beat.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(beat.pid, signal.SIGKILL)
            beat.wait(timeout=5)
    stats = rc.hgetall(keys.MAINTENANCE_STATS)
    assert int(stats[b"runs"]) > 0 and float(stats[b"last_run"]) >= started_at
