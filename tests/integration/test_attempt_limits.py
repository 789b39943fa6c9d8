"""An attempt past its limit is over on a thread pool too (``make run``'s pools): retried or dead-lettered
by its policy at the limit, its chat moving on, its late end changing nothing, its stuck thread counted.

A thread cannot be killed, so the grouping runner's watchdog (tasks.grouping) ends the attempt for the
platform. Before it, the attempt's alarm was armed only in a main thread: a thread-pool worker let a
handler run for as long as it liked, its chat blocked behind it.
"""

from __future__ import annotations

import json

import pytest
from django_celery_results.models import TaskResult

from lanes import keys
from tasks.dispatch import dispatch
from tasks.models import DeadLetter
from tests.support.helpers import define, unique, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: Far longer than the test waits: a test that passes cannot have waited for the handler.
SLEEP_S = 120


def test_a_thread_past_its_attempt_limit_is_retried_then_dead_lettered_and_its_chat_moves_on(
        rc, start_worker):
    lane, name = unique("lim"), unique("limit-sleep")
    define(name, lane=lane, handler="demo.echo", chat_scoped=True, attempt_timeout=1, timeout=300,
           policy={"max_retries": 1, "initial_backoff": 0.1, "max_backoff": 0.2, "jitter": 0.0})
    chat = unique("chat")
    stuck = dispatch.delay(name, {"sleep": SLEEP_S}, chat_id=chat)
    after = [dispatch.delay(name, {"n": n}, chat_id=chat) for n in range(3)]
    assert stuck.accepted and all(r.accepted for r in after)
    worker = start_worker(lane, pool="threads", concurrency=2)

    # Both attempts overran: a dead letter after its one retry, long before its handler returned.
    wait_until(lambda: DeadLetter.objects.filter(task_id=stuck.task_id).exists(), timeout=40,
               what="the overrunning task dead-lettered")
    letter = DeadLetter.objects.get(task_id=stuck.task_id)
    assert letter.attempts == 2, letter.attempts
    assert letter.error_class.endswith("AttemptTimeout"), (letter.error_class, letter.error_message)
    # Its chat moved on, in order.
    ids = [r.task_id for r in after]
    wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == 3, timeout=30,
               what="the chat's next messages done")
    done_at = {row.task_id: row.date_done for row in TaskResult.objects.filter(task_id__in=ids)}
    assert [done_at[i] for i in ids] == sorted(done_at[i] for i in ids)
    wait_until(lambda: TaskResult.objects.filter(task_id=stuck.task_id, status="FAILURE").exists(), timeout=10,
               what="its FAILURE row")
    # The two threads still sleeping in the handler are counted, in the worker's heartbeat.
    beat = json.loads(rc.get(keys.worker_heartbeat(f"{worker.name}@{_host()}")))
    wait_until(lambda: json.loads(rc.get(keys.worker_heartbeat(f"{worker.name}@{_host()}")))["stuck"] == 2,
               timeout=10, what="two stuck threads in the heartbeat")
    assert beat["stuck"] >= 1
    # And the worker kept its capacity: a new task runs at once on a replacement thread.
    fresh = dispatch.delay(name, {"n": "fresh"}, chat_id=unique("chat"))
    assert fresh.get(timeout=20) == {"n": "fresh"}
    # The chat left nothing behind.
    wait_until(lambda: not list(rc.scan_iter(f"dispatch:chat:{{{chat}}}*")), timeout=15, what="chat keys gone")


def test_a_late_end_of_an_abandoned_attempt_changes_nothing(rc, start_worker):
    """The overrun attempt's handler returns while its retry already succeeded: no second outcome."""
    lane, name = unique("lim"), unique("limit-late")
    define(name, lane=lane, handler="demo.flaky", attempt_timeout=1, timeout=300,
           policy={"max_retries": 3, "initial_backoff": 0.1, "max_backoff": 0.2, "jitter": 0.0})
    worker = start_worker(lane, pool="threads", concurrency=2)
    # Every attempt sleeps 3 s, past its 1 s limit, then would succeed: each is retried at its limit,
    # and the last is dead-lettered; the success each late handler returns is ignored.
    result = dispatch.delay(name, {"sleep": 3, "fail": "retry", "fail_times": 0})
    wait_until(lambda: DeadLetter.objects.filter(task_id=result.task_id).exists(), timeout=40,
               what="dead-lettered after every attempt overran")
    letter = DeadLetter.objects.get(task_id=result.task_id)
    assert letter.attempts == 4
    # Every abandoned attempt's handler returned meanwhile (3 s each): none of them changed the outcome.
    wait_until(lambda: "late_end_ignored" in worker.log_path.read_text(errors="replace"), timeout=15,
               what="a late end logged")
    wait_until(lambda: TaskResult.objects.filter(task_id=result.task_id, status="FAILURE").exists(), timeout=10,
               what="its FAILURE row")
    assert DeadLetter.objects.filter(task_id=result.task_id).count() == 1


def _host() -> str:
    import socket

    return socket.gethostname()


def test_a_worker_with_too_many_stuck_threads_restarts_itself_in_place(rc, start_worker):
    lane, name = unique("lim"), unique("limit-restart")
    define(name, lane=lane, handler="demo.echo", attempt_timeout=1, timeout=300,
           policy={"max_retries": 0})
    worker = start_worker(lane, pool="threads", concurrency=2, env={"DISPATCH_STUCK_THREADS_MAX": "1"})
    stuck = [dispatch.delay(name, {"sleep": SLEEP_S, "n": n}) for n in range(2)]
    # Two stuck threads, past the one it may keep: it restarts (same pid: exec), the stuck threads gone.
    wait_until(lambda: "Restarting celery worker" in worker.log_path.read_text(errors="replace"), timeout=40,
               what="the worker restarting itself")
    for r in stuck:
        wait_until(lambda r=r: DeadLetter.objects.filter(task_id=r.task_id).exists(), timeout=20,
                   what="each overrunning task dead-lettered")
    assert worker.alive()
    fresh = dispatch.delay(name, {"n": "after"})
    assert fresh.get(timeout=60) == {"n": "after"}
    wait_until(lambda: json.loads(rc.get(keys.worker_heartbeat(f"{worker.name}@{_host()}")) or "{}").get("stuck") == 0,
               timeout=20, what="no stuck thread after the restart")
