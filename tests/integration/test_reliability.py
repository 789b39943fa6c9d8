"""Reliable execution: retries, deadlines, crash redelivery, poison, malformed input, dead letters."""

from __future__ import annotations

import io
import json
import time
from itertools import pairwise

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client

from lanes import keys
from tasks.dispatch import dispatch
from tasks.models import DeadLetter
from tasks.retry import Backoff, delay_bounds_s
from tests.support.helpers import define, lane_depth, unique, wait_for_redelivery_room, wait_until

#: One lane each for the tests that share a worker (``shared_worker``): the others start their own,
#: to kill it, give it other settings or start it only after their tasks waited.
SHARED_LANES = {key: unique(f"l-{key}") for key in (
    "twice", "exhaust", "cli", "overrun", "shortdl", "poison", "contain", "malformed")}
SHARED_WORKER = {"concurrency": 2}


def dead_letter(task_id: str, timeout: float = 30) -> DeadLetter:
    return wait_until(lambda: DeadLetter.objects.filter(task_id=task_id).first(), timeout=timeout,
                      what=f"dead letter of {task_id}")


def test_fails_twice_then_succeeds_with_delays_from_the_policy(shared_worker, sink):
    from django_celery_results.models import TaskResult

    name, lane = unique("twice"), SHARED_LANES["twice"]
    policy = {"max_retries": 5, "initial_backoff": 0.5, "multiplier": 2.0, "max_backoff": 5.0, "jitter": 0.2}
    define(name, handler="http.post", lane=lane, options={"url": sink.url}, policy=policy)
    sink.sink.behaviour.fail_first = 2
    result = dispatch.delay(name, {"x": 1})
    assert result.get(timeout=30) == {"status": 200}
    attempts = sink.sink.attempts
    assert [a.status for a in attempts] == [500, 500, 200]
    assert [a.attempt for a in attempts] == [1, 2, 3]
    assert sink.sink.applied == {result.task_id: 1}  # one side effect
    backoff = Backoff(**policy)
    for n, (before, after) in enumerate(pairwise(attempts)):
        low, high = delay_bounds_s(backoff, n)
        gap = after.at - before.at
        assert low <= gap <= high + 1.0, (n, gap, low, high)  # +1 s: promotion tick and delivery
    assert TaskResult.objects.get(task_id=result.task_id).status == "SUCCESS"


def test_exhaustion_makes_one_dead_letter_and_requeue_needs_the_permission(shared_worker, sink):
    from django_celery_results.models import TaskResult

    name, lane = unique("exhaust"), SHARED_LANES["exhaust"]
    define(name, handler="http.post", lane=lane, options={"url": sink.url},
           policy={"max_retries": 2, "initial_backoff": 0.05, "jitter": 0.0})
    sink.sink.behaviour.always_status = 503
    result = dispatch.delay(name, {"order": 42}, idempotency_key=unique("k"), metadata={"trace": "t1"})
    with pytest.raises(Exception, match="exhausted"):
        result.get(timeout=30)
    row = dead_letter(result.task_id)
    assert DeadLetter.objects.filter(task_id=result.task_id).count() == 1
    assert row.reason == "exhausted" and row.attempts == 3 and row.lane == lane
    assert row.payload == {"order": 42} and row.metadata == {"trace": "t1"}
    assert "503" in row.error_message and "RetryableError" in row.traceback
    assert row.error_class == "tasks.errors.RetryableError"
    assert TaskResult.objects.get(task_id=result.task_id).status == "FAILURE"  # failed in Flower too
    assert len(sink.sink.attempts) == 3

    User = get_user_model()
    plain_staff = User.objects.create_user(unique("staff"), password="pw-123456", is_staff=True)
    plain_staff.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    client = Client()
    client.force_login(plain_staff)
    url = "/admin/tasks/deadletter/"
    assert client.get(url).status_code == 200
    refused = client.post(url, {"action": "requeue", "_selected_action": [row.pk]})
    assert refused.status_code in (200, 302)
    row.refresh_from_db()
    assert row.status == "dead" and not row.requeued_task_id

    operator = User.objects.create_user(unique("ops"), password="pw-123456", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="view_deadletter"),
                                  Permission.objects.get(codename="requeue_deadletter"))
    client.force_login(operator)
    sink.sink.behaviour.always_status = None
    response = client.post(url, {"action": "requeue", "_selected_action": [row.pk]})
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.status == "requeued" and row.requeued_task_id and row.resolved_by == operator.username
    from celery.result import AsyncResult

    assert AsyncResult(row.requeued_task_id).get(timeout=30) == {"status": 200}
    assert sink.sink.attempts[-1].headers["Idempotency-Key"] == row.idempotency_key
    page = client.get(f"{url}{row.pk}/change/")
    assert page.status_code == 200 and b"RetryableError" in page.content


def test_deadletters_command_lists_requeues_and_discards(shared_worker):
    name, lane = unique("cli"), SHARED_LANES["cli"]
    define(name, handler="demo.flaky", lane=lane)
    doomed = [dispatch.delay(name, {"fail": "fatal", "n": i}) for i in range(2)]
    rows = [dead_letter(r.task_id) for r in doomed]
    out = io.StringIO()
    call_command("deadletters", "--json", "--type", name, stdout=out)
    listed = json.loads(out.getvalue())
    assert {r["task_id"] for r in listed} == {r.task_id for r in doomed}
    assert {r["reason"] for r in listed} == {"non_retryable"}
    out = io.StringIO()
    call_command("deadletters", "--discard", str(rows[0].pk), stdout=out)
    rows[0].refresh_from_db()
    assert rows[0].status == "discarded"
    DeadLetter.objects.filter(pk=rows[1].pk).update(payload={"n": 1})  # now it will succeed
    out = io.StringIO()
    call_command("deadletters", "--requeue", rows[1].task_id, stdout=out)
    new_id = json.loads(out.getvalue())["task_id"]
    from celery.result import AsyncResult

    assert AsyncResult(new_id).get(timeout=30) == {"n": 1}
    from tasks.dead_letters import purge_resolved

    assert purge_resolved(retention_days=-1) >= 2
    assert not DeadLetter.objects.filter(pk__in=[r.pk for r in rows]).exists()


def test_retry_delay_longer_than_visibility_timeout_runs_exactly_once_more(start_worker, sink, rc):
    name, lane = unique("longretry"), unique("l-longretry")
    define(name, handler="http.post", lane=lane, options={"url": sink.url},
           policy={"max_retries": 3, "initial_backoff": 4.0, "multiplier": 1.0, "max_backoff": 4.0, "jitter": 0.0})
    sink.sink.behaviour.fail_first = 1
    # Visibility timeout and lease of 2 s (unacked restored every 1 s): the 4 s retry outlives both.
    start_worker(lane, concurrency=1, env={"DISPATCH_LEASE_S": "2"})
    result = dispatch.delay(name, {"x": 1})
    assert result.get(timeout=40) == {"status": 200}
    # Room for any wrong redelivery to show up (two visibility timeouts), until nothing could bring one.
    wait_for_redelivery_room(rc, lane, 4.0, (keys.task_record(result.task_id),))
    assert [a.status for a in sink.sink.attempts] == [500, 200]
    gap = sink.sink.attempts[1].at - sink.sink.attempts[0].at
    assert gap >= 4.0


def test_task_expiring_in_the_queue_never_runs(start_worker, sink):
    name, lane = unique("expire"), unique("l-expire")
    define(name, handler="http.post", lane=lane, options={"url": sink.url})
    result = dispatch.delay(name, {"x": 1}, timeout=1.0)
    time.sleep(1.5)
    start_worker(lane, concurrency=1)
    row = dead_letter(result.task_id)
    assert row.reason == "expired" and "deadline passed" in row.error_message
    assert sink.sink.attempts == []


def test_attempt_overrunning_its_limit_is_stopped_and_retried(shared_worker):
    name, lane = unique("overrun"), SHARED_LANES["overrun"]
    define(name, handler="demo.flaky", lane=lane, attempt_timeout=1, timeout=60,
           policy={"max_retries": 1, "initial_backoff": 0.1, "jitter": 0.0})
    result = dispatch.delay(name, {"sleep": 30})
    row = dead_letter(result.task_id, timeout=40)
    assert row.reason == "exhausted" and row.attempts == 2
    assert row.error_class == "tasks.errors.AttemptTimeout"


def test_deadline_shorter_than_attempt_timeout_bounds_the_attempt(shared_worker):
    name, lane = unique("shortdl"), SHARED_LANES["shortdl"]
    define(name, handler="demo.flaky", lane=lane, attempt_timeout=30, timeout=60,
           policy={"max_retries": 5, "initial_backoff": 0.1, "jitter": 0.0})
    result = dispatch.delay(name, {"sleep": 30}, timeout=2.0)
    row = dead_letter(result.task_id, timeout=20)
    assert row.reason == "expired" and row.attempts == 1


def test_whole_worker_killed_mid_task_is_redelivered_within_the_lease(start_worker, sink):
    name, lane = unique("crash"), unique("l-crash")
    define(name, handler="http.post", lane=lane, options={"url": sink.url}, attempt_timeout=30)
    sink.sink.behaviour.delay_s = (2.0, 2.0)
    victim = start_worker(lane, concurrency=1)
    results = [dispatch.delay(name, {"i": i}, idempotency_key=f"crash-{unique('k')}") for i in range(3)]
    wait_until(lambda: sink.sink.attempts or any(sink.sink.in_flight.values()), timeout=20, what="in flight")
    victim.kill()
    killed_at = time.monotonic()
    start_worker(lane, concurrency=1)
    for r in results:
        r.get(timeout=60)
    recovered_in = time.monotonic() - killed_at
    assert recovered_in < 45  # lease 6 s in tests, plus restore and three 2 s sends
    # The sink dedupes on Idempotency-Key: each task's effect is made once; a send cut
    # off by the crash may arrive a second time with the same key (at-least-once).
    assert set(sink.sink.applied) == {a.headers["Idempotency-Key"] for a in sink.sink.attempts}
    assert len(sink.sink.applied) == 3 and all(n <= 2 for n in sink.sink.applied.values())
    for r in results:
        attempts = [a for a in sink.sink.attempts if a.headers["X-Dispatch-Task-Id"] == r.task_id]
        assert 1 <= len(attempts) <= 2
        assert len({a.headers["Idempotency-Key"] for a in attempts}) == 1


def test_poison_task_becomes_a_dead_letter_and_the_worker_keeps_serving(shared_worker):
    name, lane = unique("poison"), SHARED_LANES["poison"]
    define(name, handler="demo.flaky", lane=lane)
    worker = shared_worker
    result = dispatch.delay(name, {"fail": "crash"})
    row = dead_letter(result.task_id, timeout=60)
    assert row.reason == "poison" and "died" in row.error_message
    assert worker.alive()
    ok = unique("ok")
    define(ok, handler="demo.echo", lane=lane)
    assert dispatch.delay(ok, {"fine": True}).get(timeout=20) == {"fine": True}


def test_system_exit_and_unserializable_results_are_contained(shared_worker):
    name, lane = unique("contain"), SHARED_LANES["contain"]
    define(name, handler="demo.flaky", lane=lane, policy={"max_retries": 1, "initial_backoff": 0.05})
    worker = shared_worker
    exiting = dispatch.delay(name, {"fail": "exit"})
    weird = dispatch.delay(name, {"fail": "unserializable"})
    assert dead_letter(exiting.task_id).reason == "exhausted"
    assert "SystemExit" in dead_letter(exiting.task_id).error_message
    row = dead_letter(weird.task_id)
    assert row.reason == "non_retryable" and "not JSON" in row.error_message
    assert worker.alive()


def test_malformed_messages_on_a_lane_are_recorded_not_run(shared_worker, rc):
    from lanes.messages import Envelope, build_message, kombu_message

    name, lane = unique("malformed"), SHARED_LANES["malformed"]
    define(name, handler="demo.flaky", lane=lane)
    worker = shared_worker
    now = time.time()
    env = Envelope(type=name, lane=lane, priority=5, attempt=1, deadline=now + 60, dispatched_at=now)

    template = build_message("x", "demo.flaky", '{"n":1}', env, 10)  # as a record stores it

    def push(task_id: str, change_body=None, task: str = "demo.flaky") -> None:
        message = kombu_message(template, task_id, keys.task_record(task_id), f"{task_id}.1")  # a whole one
        message["headers"].update(id=task_id, task=task)
        args, kwargs, embed = json.loads(message["body"])
        if change_body:
            change_body(kwargs)
        message["body"] = json.dumps([args, kwargs, embed])
        rc.lpush(keys.lane_queue(lane, 4), json.dumps(message))

    push("m-noenv", lambda kw: kw.pop("dispatch"))
    push("m-badtype", lambda kw: kw["dispatch"].update(attempt="one"))
    push("m-unknown", task="no.such.handler")
    push("m-payload", lambda kw: kw.update(payload=[1, 2]))
    push("m-extra", lambda kw: kw.update(surprise=True))
    rc.lpush(keys.lane_queue(lane, 4), b"\xff\xfe garbage, not JSON \x00")
    for task_id in ("m-noenv", "m-badtype", "m-unknown", "m-payload", "m-extra"):
        assert dead_letter(task_id).reason == "malformed", task_id
    wait_until(lambda: lane_depth(rc, lane) == 0, timeout=20, what="lane emptied")
    wait_until(lambda: DeadLetter.objects.filter(error_message__contains="could not be decoded").exists(),
               what="garbage recorded")
    assert worker.alive()
    ok = unique("ok")
    define(ok, handler="demo.echo", lane=lane)
    assert dispatch.delay(ok, {"after": "garbage"}).get(timeout=20) == {"after": "garbage"}


def test_the_hard_limit_leaves_room_to_record_the_outcome_while_redis_is_away():
    """An attempt past its soft limit still records its outcome, retrying for up to two leases
    while Redis is away (tasks.execution.until_answered). A hard limit inside that window
    killed a prefork child waiting on a frozen Redis, mid-write to the pool's pipe: the
    worker's main process then stopped on UnpicklingError (fault scenario 4, intermittent)."""
    from django.conf import settings

    from lanes.messages import Envelope, build_message, kombu_message

    now = time.time()
    env = Envelope(type="t", lane="l", priority=5, attempt=1, deadline=now + 60, dispatched_at=now)
    stored = build_message("x", "demo.echo", "{}", env, 10)
    hard, soft = kombu_message(stored, "x", "r", "x.1")["headers"]["timelimit"]
    assert soft == 10
    assert hard - soft > 2 * settings.DISPATCH_LEASE_S + 2 * settings.DISPATCH_REDIS_TIMEOUT_S
