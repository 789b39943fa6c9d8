"""Cancel with real workers and the loopback sink: what a cancel stops is never seen by the sink.

Every assertion about what ran comes from the sink's record of the requests it
received; nothing is asserted about how fast anything was.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from celery.exceptions import TaskRevokedError
from django_celery_results.models import TaskResult

from lanes import keys
from tasks.dispatch import dispatch
from tasks.models import DeadLetter
from tests.support.helpers import define, unique, wait_for_redelivery_room, wait_until
from tools.loadcheck import Delivery, Op, check


def sink_key(task_id: str) -> str:
    return task_id  # http.post sends the task id as Idempotency-Key when the task has none


def test_queued_head_middle_retry_waiting_and_running_cancels(start_worker, sink, rc):
    name, lane = unique("cw"), unique("lcw")
    # A failed attempt waits 20 s for its retry: long enough to be cancelled while it waits.
    define(name, handler="http.post", lane=lane, chat_scoped=True, options={"url": sink.url}, timeout=120,
           policy={"max_retries": 3, "initial_backoff": 20.0, "max_backoff": 30.0, "jitter": 0.0})
    chat_a, chat_b, chat_c = unique("a"), unique("b"), unique("c")
    # Before any worker: chat C's head (queued, in the lane list) and chat A's middle message.
    c = [dispatch.delay(name, {"seq": i}, chat_id=chat_c).task_id for i in range(3)]
    a = [dispatch.delay(name, {"seq": 0, "sink_delay_s": 1.5, "sink_fail_first": 1}, chat_id=chat_a).task_id]
    a += [dispatch.delay(name, {"seq": i}, chat_id=chat_a).task_id for i in range(1, 4)]
    b = [dispatch.delay(name, {"seq": 0, "sink_fail_first": 1}, chat_id=chat_b).task_id]
    b += [dispatch.delay(name, {"seq": 1}, chat_id=chat_b).task_id]
    assert dispatch.cancel(c[0], "queued head").outcome == "cancelled"
    assert dispatch.cancel(a[2], "middle").outcome == "cancelled"
    start_worker(lane, pool="threads", concurrency=4)
    # A running task: its first attempt is in flight at the sink (it will answer 503).
    wait_until(lambda: sink.sink.attempts_for(sink_key(a[0])) or _in_flight(sink, chat_a), timeout=30,
               what="chat A's head running")
    assert dispatch.cancel(a[0], "running").outcome == "running_told"
    # A retry-waiting task: its first attempt failed, its retry waits in the delayed set.
    b_record = keys.task_record(b[0], chat_b)
    wait_until(lambda: rc.hget(b_record, "st") == b"retry", timeout=30, what="chat B's head parked for a retry")
    assert dispatch.cancel(b[0], "retry waiting").outcome == "cancelled"
    # Everything not cancelled runs, in its chat's order.
    wait_until(lambda: all(sink.sink.applied.get(t) for t in (c[1], c[2], a[1], a[3], b[1])), timeout=60,
               what="the uncancelled messages applied")
    # Room for anything that should not happen to show at the sink, until Redis holds nothing that could.
    wait_for_redelivery_room(rc, lane, 1.0, tuple(keys.task_record(t, chat)
                                                 for chat, ids in ((chat_a, a), (chat_b, b), (chat_c, c)) for t in ids))
    assert not sink.sink.attempts_for(c[0]) and not sink.sink.attempts_for(a[2])
    assert len(sink.sink.attempts_for(a[0])) == 1  # told while running: never retried
    assert len(sink.sink.attempts_for(b[0])) == 1  # cancelled while waiting for its retry
    assert sink.sink.order[chat_c] == [1, 2] and sink.sink.order[chat_a] == [1, 3] and sink.sink.order[chat_b] == [1]
    assert not sink.sink.overlaps
    for task_id in (c[0], a[2], a[0], b[0]):
        # Final: a late RETRY row of the retry-waiting one (stored by Celery after it parked) never replaces it.
        assert TaskResult.objects.get(task_id=task_id).status == "REVOKED", task_id
        with pytest.raises(TaskRevokedError):
            dispatch_result(task_id).get(timeout=10)
    assert "running" in TaskResult.objects.get(task_id=a[0]).result
    assert not DeadLetter.objects.filter(task_type=name).exists()
    # Nothing left behind: no chat keys, no waiting counts, no record.
    wait_until(lambda: not list(rc.scan_iter(f"dispatch:chat:{{{chat_a}}}*")), timeout=10, what="chat A's keys gone")
    assert not rc.exists(keys.lane_chat_waiting(lane), keys.lane_delayed(lane))
    # The processes' in-memory counters reach Redis within a beat.
    cancelled = wait_until(lambda: (n := int(rc.hget(keys.METRICS_TOTAL, f"cancelled|{lane}|{name}") or 0)) >= 4
                           and n, timeout=10, what="four cancels counted")
    assert cancelled == 4


def _in_flight(sink, chat: str) -> bool:
    with sink.sink.lock:
        return sink.sink.in_flight.get(chat, 0) > 0


def dispatch_result(task_id: str):
    from tasks.dispatch import DispatchResult

    return DispatchResult(True, task_id)


def test_fifty_concurrent_cancels_and_dispatches_on_one_chat_keep_the_invariants(start_worker, sink, rc):
    """One dispatcher sends 100 messages of one chat while four threads cancel 50 of them at random
    moments (waiting, head, running). The fault checker: no uncancelled message lost, no duplicate,
    order kept; and no message whose cancel answered ``cancelled`` ever reached the sink."""
    name, lane, chat = unique("cx"), unique("lcx"), unique("chat")
    define(name, handler="http.post", lane=lane, chat_scoped=True, chat_queue_size=200, options={"url": sink.url},
           timeout=120)
    start_worker(lane, pool="threads", concurrency=4)
    n, cancels = 100, 50
    ops: list[Op] = []
    ready: list[str] = []
    lock = threading.Lock()
    answers: dict[str, str] = {}
    rng = random.Random(18)
    targets = set(rng.sample(range(n), cancels))

    def send() -> None:
        for seq in range(n):
            r = dispatch.delay(name, {"seq": seq, "sink_delay_s": 0.01}, chat_id=chat)
            with lock:
                ops.append(Op(chat, seq, r.task_id or f"rejected-{seq}", r.accepted, r.task_id or "", r.reason or ""))
                if seq in targets:
                    ready.append(r.task_id)

    def cancel(share: int) -> None:
        done = 0
        while done < share:
            with lock:
                task_id = ready.pop(rng.randrange(len(ready))) if ready else None
            if task_id is None:
                time.sleep(0.002)
                continue
            answers[task_id] = dispatch.cancel(task_id, "fuzz").outcome
            done += 1

    threads = [threading.Thread(target=send)] + [
        threading.Thread(target=cancel, args=(cancels // 4 + (i < cancels % 4),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(answers) == cancels and all(op.accepted for op in ops)
    assert set(answers.values()) <= {"cancelled", "running_told", "already_done"}, answers
    revoked = set(TaskResult.objects.filter(task_id__in=[op.task_id for op in ops], status="REVOKED")
                  .values_list("task_id", flat=True))

    def settled() -> bool:
        with sink.sink.lock:
            applied = set(sink.sink.applied)
        ended = applied | set(TaskResult.objects.filter(task_id__in=[op.task_id for op in ops], status="REVOKED")
                              .values_list("task_id", flat=True))
        return all(op.task_id in ended for op in ops)

    wait_until(settled, timeout=90, what="every message applied or cancelled")
    wait_for_redelivery_room(rc, lane, 1.0, tuple(keys.task_record(op.task_id, op.chat) for op in ops if op.accepted))
    revoked = set(TaskResult.objects.filter(task_id__in=[op.task_id for op in ops], status="REVOKED")
                  .values_list("task_id", flat=True))
    with sink.sink.lock:
        attempts = list(sink.sink.attempts)
    deliveries = [Delivery(x.key, x.headers.get("X-Dispatch-Task-Id", ""), x.chat, x.body.get("seq"), x.status,
                           x.started, x.at) for x in attempts]
    dead = {t: "cancelled" for t in revoked}
    dead.update(DeadLetter.objects.filter(task_type=name).values_list("task_id", "reason"))
    report = check(ops, deliveries, dead, scenario="cancel-50")
    assert report.lost == 0 and report.duplicate_effects == 0 and report.order_violations == 0, report.summary()
    assert report.unexpected == 0 and report.succeeded + report.dead == n, report.summary()
    removed = {t for t, outcome in answers.items() if outcome == "cancelled"}
    assert removed and not {d.task_id for d in deliveries} & removed
    assert removed <= revoked
    assert not report.dead_reasons.keys() - {"cancelled"}
    wait_until(lambda: not list(rc.scan_iter(f"dispatch:chat:{{{chat}}}*")), timeout=15, what="chat keys gone")
    assert not rc.exists(keys.lane_chat_waiting(lane))


def test_a_copy_of_a_cancelled_task_reaching_a_worker_is_dropped(start_worker, sink, rc):
    """A worker had popped the message before the cancel (or a stale copy stays in the list): start.lua
    sees the record (or its tombstone) say cancelled, and the handler never runs."""
    name, lane = unique("cd"), unique("lcd")
    define(name, handler="http.post", lane=lane, options={"url": sink.url}, timeout=120)
    settled, unsettled = dispatch.delay(name, {"n": 0}), dispatch.delay(name, {"n": 1})
    copies = {r.task_id: next(m for q in keys.lane_queues(lane) for m in rc.lrange(q, 0, -1) if r.task_id.encode() in m)
              for r in (settled, unsettled)}
    assert settled.cancel().outcome == "cancelled"
    # The other one as if its canceller died between Redis and the row: cancelled in Redis, row not written.
    from tasks import cancel as cancelling

    detail = cancelling.describe("died midway", "test")
    record = keys.task_record(unsettled.task_id)
    [found] = lua_cancel_only(record, unsettled.task_id, detail)
    assert found.outcome == "cancelled" and rc.hget(record, "st") == b"cancelled"
    assert lane_depth_of(rc, lane) == 0
    for copy in copies.values():  # the copies come back, as a popped one would reach a worker
        rc.lpush(copy_queue(lane), copy)
    start_worker(lane, pool="threads", concurrency=2)
    wait_until(lambda: TaskResult.objects.filter(task_id=unsettled.task_id, status="REVOKED").exists(), timeout=30,
               what="the worker storing the REVOKED row of the unsettled cancel")
    wait_until(lambda: not rc.exists(record), timeout=10, what="the cancelled record settled")
    wait_until(lambda: lane_depth_of(rc, lane) == 0, timeout=10, what="the copies consumed")
    time.sleep(0.5)
    assert not sink.sink.attempts  # neither ran
    assert "died midway" in TaskResult.objects.get(task_id=unsettled.task_id).result
    assert TaskResult.objects.get(task_id=settled.task_id).status == "REVOKED"


def lua_cancel_only(record: str, task_id: str, detail: str, settle_lease_ms: int | None = None):
    """cancel.lua alone, as a canceller that died before the REVOKED row; ``settle_lease_ms``: the record's
    settle lease (the cancel's own, DISPATCH_LEASE_S, by default)."""
    import json

    from django.conf import settings

    from lanes.lua.cancel import cancel

    lease_ms = int(settings.DISPATCH_LEASE_S * 1000) if settle_lease_ms is None else settle_lease_ms
    return cancel(now=time.time(), detail=detail, detail_json=json.dumps(detail), tombstone_ttl_s=600,
                  settle_lease_ms=lease_ms, queued_lease_ms=60_000, targets=[(task_id, record)])


def lane_depth_of(rc, lane: str) -> int:
    return sum(rc.llen(q) for q in keys.lane_queues(lane))


def copy_queue(lane: str) -> str:
    from lanes.priorities import to_kombu

    return keys.lane_queue(lane, to_kombu(5))  # the type's default priority


def test_a_cancel_whose_process_died_before_the_row_is_recorded_by_the_sweep(start_worker, sink, rc):
    """Redis said cancelled, the REVOKED row was never written (the canceller died): the record's settle
    lease runs out, the sweep republishes it, a worker stores the row from the record and settles it."""
    name, lane, chat = unique("cs"), unique("lcs"), unique("chat")
    define(name, handler="http.post", lane=lane, chat_scoped=True, options={"url": sink.url}, timeout=120)
    head, nxt = (dispatch.delay(name, {"seq": i}, chat_id=chat) for i in range(2))
    record = keys.task_record(head.task_id, chat)
    # A settle lease of 1 s, not the session's 6: what runs out and what the sweep then does are the same,
    # 5 s sooner.
    [found] = lua_cancel_only(record, head.task_id, "cancelled by test: died midway", settle_lease_ms=1000)
    assert found.outcome == "cancelled"
    start_worker(lane, pool="threads", concurrency=2)
    wait_until(lambda: sink.sink.applied.get(nxt.task_id), timeout=30, what="the next message of the chat run")
    wait_until(lambda: TaskResult.objects.filter(task_id=head.task_id, status="REVOKED").exists(), timeout=60,
               what="the swept record's REVOKED row")
    wait_until(lambda: not rc.exists(record), timeout=10, what="the cancelled record settled")
    assert not sink.sink.attempts_for(head.task_id)
