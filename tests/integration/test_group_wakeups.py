"""What a grouping worker's event loop does per message, counted in a real thread-pool worker
(``tests.support.runner_counts``, loaded through ``DISPATCH_HOOK_MODULES``): it wakes a run thread once a burst,
not once a message (the thread woken wakes the next), and a group's successes are acked in one callback on the
loop, not one a message; a run thread is woken only when no other is free to take the work. Counted, never
timed."""

from __future__ import annotations

from django_celery_results.models import TaskResult

from tasks.bulk import dispatch_many
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until
from tests.support.runner_counts import read

COUNTS = {"DISPATCH_HOOK_MODULES": "tests.support.runner_counts"}


def test_a_burst_wakes_run_threads_once_a_pop_and_each_group_is_acked_in_one_callback(rc, start_worker):
    type_name, lane = unique("gwake"), unique("l-gwake")
    define(type_name, lane=lane)
    worker = start_worker(lane, pool="threads", concurrency=8, env=COUNTS)
    for result in [dispatch.delay(type_name, {"warm": i}) for i in range(5)]:
        result.get(timeout=60)
    wait_until(lambda: read(rc, worker.pid)["acks"] >= 5, timeout=30, what="the warm-up's acks counted")
    before = read(rc, worker.pid)
    n = 400
    sent = dispatch_many(type_name, [{"i": i} for i in range(n)])
    assert all(result.accepted for result in sent)
    ids = [result.task_id for result in sent]
    wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == n, timeout=120,
               what=f"{n} results stored")
    wait_until(lambda: read(rc, worker.pid)["acks"] - before["acks"] >= n, timeout=30, what=f"{n} acks counted")
    counts = read(rc, worker.pid)
    counts.subtract(before)
    assert counts["submits"] == n and counts["acks"] == n, counts
    # Before: one notify a message handed to the runner (n); now about one a pop (more only when a thread
    # woken for an earlier message took it while the same pop was still being delivered), none while a
    # thread woken for an earlier message has not taken it yet.
    assert counts["submit_notifies"] < n / 4, counts
    # A thread is woken only when every other one is waiting or busy (in a handler, its signals, a finish):
    # before, 244-318 wake-ups for 400 tasks, 86 % of them finding their work already taken; now about 100.
    assert counts["wakeups"] < 0.4 * n, counts
    # Every task finished in a group (group commit: several a call under a burst), each group acked in one
    # callback on the event loop (before: one callback a message, as many as the tasks).
    assert counts["finished_items"] == n and counts["finish_calls"] < n, counts
    assert counts["ack_callbacks"] == counts["finish_calls"], counts


def test_a_grouped_message_is_parsed_once_its_envelope_as_written_handed_to_the_runner(rc, start_worker):
    """The event loop reads each part of a grouped message's body once: the envelope where the transport writes
    the message out (its headers need it), the payload where the runner takes it. Before: the runner parsed
    the whole body again, two parses of the envelope a message."""
    type_name, lane = unique("gparse"), unique("l-gparse")
    define(type_name, lane=lane)
    worker = start_worker(lane, pool="threads", concurrency=8, env=COUNTS)
    for result in [dispatch.delay(type_name, {"warm": i}) for i in range(3)]:
        result.get(timeout=60)
    wait_until(lambda: read(rc, worker.pid)["acks"] >= 3, timeout=30, what="the warm-up's acks counted")
    before = read(rc, worker.pid)
    n = 100
    sent = dispatch_many(type_name, [{"pmark": i} for i in range(n)])
    assert all(result.accepted for result in sent)
    ids = [result.task_id for result in sent]
    wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == n, timeout=120,
               what=f"{n} results stored")
    wait_until(lambda: read(rc, worker.pid)["acks"] - before["acks"] >= n, timeout=30, what=f"{n} acks counted")
    counts = read(rc, worker.pid)
    counts.subtract(before)
    assert counts["submits"] == n, counts
    assert counts["payload_parses"] == n, counts  # once: the runner's, from the payload's text
    assert counts["envelope_parses"] == n, counts  # once: the transport's (before: 2 n, the runner's again)
