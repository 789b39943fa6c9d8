"""Send later and a retry policy per call with real worker processes, a real Redis and the loopback sink.

Every time asserted is a task's start as the sink saw it (``Attempt.started``)
against the time it was dispatched: a task sent for later never starts before it
is due, and starts once, even when its countdown is longer than the lease and the
broker's visibility timeout (kombu#337), its worker restarts, or Redis restarts
from its AOF while it waits.
"""

from __future__ import annotations

import time

from lanes import keys
from tasks import config
from tasks.dispatch import admit
from tasks.models import DeadLetter, RetryPolicy
from tests.support.helpers import define, unique, wait_for_redelivery_room, wait_until

#: The lease (and the broker's visibility timeout) of these tests' workers: shorter than the suite's
#: 6 s, so a countdown past it, and the wait for a second delivery, cost seconds less.
WORKER_LEASE_S = 2
WORKER_ENV = {"DISPATCH_LEASE_S": str(WORKER_LEASE_S)}
#: Longer than the workers' lease and visibility timeout.
COUNTDOWN_S = WORKER_LEASE_S + 4
#: One lane each for the tests that share a worker with the suite's lease (``shared_worker``); the
#: others start their own, with the short lease, or to kill it.
SHARED_LANES = {key: unique(f"sw-{key}") for key in ("chat", "policy")}
SHARED_WORKER = {"pool": "threads", "concurrency": 4}


def http_type(sink, lane: str, **fields) -> str:
    name = unique("sch")
    define(name, handler="http.post", lane=lane, options={"url": sink.url}, timeout=120, **fields)
    config.forget()
    return name


def attempts(sink, key: str) -> list:
    with sink.sink.lock:
        return [a for a in sink.sink.attempts if a.key == key]


def send_later(name: str) -> tuple[str, float, str]:
    """Dispatch one task due in COUNTDOWN_S; returns its idempotency key (the sink's key), when it was sent, its id."""
    key = unique("k")
    sent = time.time()
    result = admit(name, {"n": 1}, countdown=COUNTDOWN_S, idempotency_key=key)
    assert result.accepted, result
    return key, sent, result.task_id


def assert_ran_once_when_due(sink, rc, key: str, sent: float, lane: str, task_id: str) -> None:
    wait_until(lambda: attempts(sink, key), timeout=COUNTDOWN_S + 40, what="the scheduled task ran")
    # Past another lease and visibility timeout a second delivery would have come, and none can
    # once Redis holds no message of the lane and the task's record is settled.
    wait_for_redelivery_room(rc, lane, WORKER_LEASE_S + 2, (keys.task_record(task_id),))
    seen = attempts(sink, key)
    assert len(seen) == 1, [(a.attempt, a.started) for a in seen]
    assert seen[0].started >= sent + COUNTDOWN_S, seen[0].started - sent
    assert not rc.exists(keys.lane_delayed(lane))


def test_a_countdown_longer_than_the_lease_runs_once_and_not_before_it_is_due(start_worker, sink, rc):
    lane = unique("sw")
    name = http_type(sink, lane)
    start_worker(lane, pool="threads", concurrency=2, env=WORKER_ENV)
    key, sent, task_id = send_later(name)
    assert_ran_once_when_due(sink, rc, key, sent, lane, task_id)
    # Its queue latency counts from its due time, not from the dispatch (the worker's in-memory
    # counters reach Redis within a beat).
    qlat = wait_until(lambda: rc.hget(keys.METRICS_TOTAL, f"qlat_sum|{lane}|{name}"), timeout=10,
                      what="the queue latency counted")
    assert float(qlat) < COUNTDOWN_S / 2


def test_a_countdown_survives_a_worker_restart_and_a_redis_restart_from_the_aof(start_worker, sink, redis_server):
    """While it waits, its worker is SIGKILLed, then Redis (restarted from its AOF), then a new worker starts.

    (One test for both restarts: each waits a countdown and a lease, and the suite's time is bounded.)
    """
    lane = unique("sw")
    name = http_type(sink, lane)
    first = start_worker(lane, pool="threads", concurrency=2, env=WORKER_ENV)
    key, sent, task_id = send_later(name)
    time.sleep(0.5)
    first.kill()  # SIGKILL: nothing of the task was in it
    redis_server.stop(kill=True)  # SIGKILL: what it holds comes back from its AOF (appendfsync always)
    time.sleep(0.5)
    redis_server.start()
    rc = redis_server.client()
    assert rc.hget(keys.task_record(task_id), "st") == b"scheduled"  # still waiting, from the AOF
    start_worker(lane, pool="threads", concurrency=2, env=WORKER_ENV)
    assert_ran_once_when_due(sink, rc, key, sent, lane, task_id)


def test_a_scheduled_chat_message_holds_the_later_ones_behind_it(shared_worker, sink, rc):
    lane = SHARED_LANES["chat"]
    name = http_type(sink, lane, chat_scoped=True)
    chat = unique("c")
    sent = time.time()
    results = [
        admit(name, {"seq": 0}, chat_id=chat),
        admit(name, {"seq": 1}, chat_id=chat, countdown=3),
        admit(name, {"seq": 2}, chat_id=chat),
        admit(name, {"seq": 3}, chat_id=chat),
    ]
    assert all(r.accepted for r in results), results
    other = admit(name, {"seq": 0}, chat_id=unique("c"))  # another chat is not held
    wait_until(lambda: len(sink.sink.order.get(chat, [])) == 4, timeout=60, what="the chat's four messages")
    assert sink.sink.order[chat] == [0, 1, 2, 3]
    by_seq = {a.body["seq"]: a for a in sink.sink.attempts if a.chat == chat}
    assert by_seq[1].started >= sent + 3
    assert by_seq[1].at <= by_seq[2].started <= by_seq[3].started  # they waited behind it, in order
    assert not sink.sink.overlaps
    assert attempts(sink, other.task_id)[0].started < sent + 3
    assert not rc.exists(keys.chat_queue(chat), keys.lane_chat_waiting(lane), keys.lane_delayed(lane))


def test_a_named_retry_policy_sets_the_attempts(shared_worker, sink, rc):
    lane = SHARED_LANES["policy"]
    name = http_type(sink, lane, policy={"max_retries": 2, "initial_backoff": 0.1, "max_backoff": 0.2})
    RetryPolicy.objects.update_or_create(name="one-shot-w", defaults={"max_retries": 0, "initial_backoff": 0.1,
                                                                     "max_backoff": 0.1})
    own_key, once_key = unique("own"), unique("once")
    own = admit(name, {"sink_status": 500}, idempotency_key=own_key)
    once = admit(name, {"sink_status": 500}, idempotency_key=once_key, retry_policy="one-shot-w")
    assert own.accepted and once.accepted, (own, once)
    wait_until(lambda: DeadLetter.objects.filter(task_id__in=[own.task_id, once.task_id]).count() == 2,
               timeout=60, what="both dead letters")
    assert [a.attempt for a in attempts(sink, once_key)] == [1]  # the named policy: no retry
    assert [a.attempt for a in attempts(sink, own_key)] == [1, 2, 3]  # the type's policy: 2 retries
    assert DeadLetter.objects.get(task_id=once.task_id).attempts == 1
