"""The chat audit moves on a head held past its attempt limit plus the lease by an owner that
cannot move it: each stuck state built through the real scripts, on the session's Redis."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django_celery_results.models import TaskResult
from prometheus_client import generate_latest

from lanes import keys, leases
from lanes.lua.finish import Finished, finish
from lanes.lua.pop_more import pop_more
from lanes.lua.start import Started, start
from lanes.lua.sweep import sweep
from lanes.models import LaneEvent
from ops.prometheus import registry
from tasks.dispatch import dispatch
from tasks.maintenance import audit_chats
from tests.support.helpers import define, unique, wait_until

ATTEMPT_S = 2


def _repaired(rc, lane: str, cause: str) -> int:
    return int(rc.hget(keys.METRICS_TOTAL, f"chats_repaired|{lane}|{cause}") or 0)


def _held_ms() -> int:
    return int((ATTEMPT_S + settings.DISPATCH_LEASE_S) * 1000)


def _audit_until(rc, now_ms: int) -> None:
    """Two audit walks over every chat and every parked lease: the first notes what it sees, the
    second (past the hold) repairs."""
    for at in (now_ms, now_ms + _held_ms() + 1000):
        rc.delete(keys.CHAT_AUDIT_CURSOR, keys.PARKED_AUDIT_CURSOR)
        for _ in range(1000):
            audit_chats(batch=100_000, now_ms=at)
            if not int(rc.get(keys.PARKED_AUDIT_CURSOR) or 0):
                break


def _claim(record: str, task_id: str, chat: str, owner: str, now: float, lease_ms: int) -> Started:
    return start(task_id=task_id, record=record, chat=chat, attempt=1, owner=owner, now=now, lease_ms=lease_ms,
                 max_deliveries=5, dead_owner="", metric_field="x|y", queue_latency_bucket="", queue_latency_s=0.0,
                 process=owner.rsplit(":", 1)[0], liveness_ms=5000)


def _finish(record: str, task_id: str, chat: str, owner: str, now: float) -> Finished:
    return finish(task_id=task_id, record=record, chat=chat, outcome="done", result_json="null", now=now,
                  tombstone_ttl_s=60, queued_lease_ms=120_000, metric_field="x|y", reason="",
                  execution_latency_bucket="", execution_latency_s=0.0, owner=owner, settle_lease_ms=10_000)


@pytest.mark.parametrize("lost", ["acked", "left_in_hand"])
def test_a_head_lost_unclaimed_after_its_pop_is_republished_and_its_chat_runs_in_order(rc, start_worker,
                                                                                       admin_client, lost):
    """The recorded stall (FAULTS.md): a live worker pops the head (named in its in-hand set) and
    loses it unclaimed: its claim met Redis away and the failed task was acked (the in-hand entry
    goes at the next beat: ``acked``), or the pop's reply was lost, or the ack went with a dropped
    broker channel (the entry stays: ``left_in_hand``). The record stays 'queued' under its queued
    lease; when that runs out the sweep finds the lane list holding other messages and parks the
    lease ('+inf'), taking the copy to wait there. Nothing looked at it again until its deadline."""
    name, lane = unique("stuck-head"), unique("l-stuck")
    define(name, lane=lane, chat_scoped=True, attempt_timeout=ATTEMPT_S, timeout=600)
    chat, other = unique("chat"), unique("other")
    sent = [dispatch.delay(name, {"seq": i}, chat_id=chat) for i in range(3)]
    bystander = dispatch.delay(name, {"seq": 0}, chat_id=other)
    assert all(r.accepted for r in [*sent, bystander])
    head = keys.task_record(sent[0].task_id, chat)
    in_hand = keys.process_in_hand(leases.process_id())
    popped = pop_more(rc, lane, keys.lane_queues(lane), 1)
    assert [p.record for p in popped] == [head]
    if lost == "acked":
        rc.srem(in_hand, head)  # the beat's SREM of what is out of hand
    now_ms = int(time.time() * 1000) + int(settings.DISPATCH_QUEUED_LEASE_S * 1000) + 1000
    sweep(now_ms=now_ms, batch=10_000, queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000))
    assert rc.zscore(keys.LEASES, head) == float("inf")  # parked: its copy taken to wait in the list
    assert rc.hget(head, "st") == b"queued"
    before = _repaired(rc, lane, "lost_copy")

    _audit_until(rc, now_ms)

    assert _repaired(rc, lane, "lost_copy") == before + 1
    # The bystander's head waits in its list with its copy: left alone (no lease: admission writes none, and
    # no pop took it; before 2026-12-02 the sweep parked the one admission wrote).
    assert rc.zscore(keys.LEASES, keys.task_record(bystander.task_id, other)) is None
    assert rc.hget(keys.task_record(bystander.task_id, other), "pub") == b"1"
    rc.srem(in_hand, head)
    event = LaneEvent.objects.filter(lane=lane, action="chat_repaired").get()
    assert sent[0].task_id in event.detail and "lost_copy" in event.detail
    # Counted for Prometheus, and shown on the dashboard (a repair is a bug report).
    scraped = generate_latest(registry()).decode()
    assert f'dispatch_chats_repaired_total{{cause="lost_copy",lane="{lane}"}} ' in scraped
    page = admin_client.get("/admin/dashboard/").content.decode()
    assert "Chats repaired" in page and sent[0].task_id in page and lane in page
    # The chat moves on, in order, with a real worker.
    start_worker(lane, pool="threads", concurrency=2)
    ids = [r.task_id for r in sent]
    wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == 3, timeout=60,
               what="the repaired chat's three tasks")
    done = dict(TaskResult.objects.filter(task_id__in=ids).values_list("task_id", "date_done"))
    assert sorted(ids, key=done.__getitem__) == ids


def test_a_task_of_no_chat_lost_unclaimed_after_its_pop_is_republished(rc):
    """The same loss for a task of no chat: it waited for its deadline too (and held any limit slot)."""
    name, lane = unique("stuck-plain"), unique("l-stuck-plain")
    define(name, lane=lane, attempt_timeout=ATTEMPT_S, timeout=600)
    lost, bystander = (dispatch.delay(name, {"i": i}) for i in range(2))
    record = keys.task_record(lost.task_id)
    assert [p.record for p in pop_more(rc, lane, keys.lane_queues(lane), 1)] == [record]  # its reply lost
    now_ms = int(time.time() * 1000) + int(settings.DISPATCH_QUEUED_LEASE_S * 1000) + 1000
    sweep(now_ms=now_ms, batch=10_000, queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000))
    assert rc.zscore(keys.LEASES, record) == float("inf")
    before = _repaired(rc, lane, "lost_copy")
    _audit_until(rc, now_ms)
    assert _repaired(rc, lane, "lost_copy") == before + 1
    copies = [m for q in keys.lane_queues(lane) for m in rc.lrange(q, 0, -1)]
    assert len(copies) == 2 and any(lost.task_id.encode() in m for m in copies)
    assert rc.zscore(keys.LEASES, keys.task_record(bystander.task_id)) is None  # its copy waits, never popped
    rc.srem(keys.process_in_hand(leases.process_id()), record)
    event = LaneEvent.objects.filter(lane=lane, action="chat_repaired").get()
    assert event.detail.startswith(f"task {lost.task_id} ")


@pytest.mark.parametrize("cause", ["not_running", "owner_dead", "owner_gone"])
def test_a_running_head_whose_owner_cannot_move_it_is_republished_and_a_late_finish_changes_nothing(rc, cause):
    name, lane = unique("held-head"), unique("l-held")
    define(name, lane=lane, chat_scoped=True, attempt_timeout=ATTEMPT_S, timeout=600)
    chat = unique("chat")
    sent = [dispatch.delay(name, {"seq": i}, chat_id=chat) for i in range(2)]
    head, task_id = keys.task_record(sent[0].task_id, chat), sent[0].task_id
    proc = f"ghost-{unique('h')}:4242"
    owner = f"{proc}:1"
    now = time.time()
    assert [p.record for p in pop_more(rc, lane, keys.lane_queues(lane), 4)] == [head]
    rc.delete(keys.process_in_hand(leases.process_id()))
    # Claimed, then its lease renewed far ahead (as a beat renews every lease it still counts)...
    assert _claim(head, task_id, chat, owner, now, 6000).status == "run"
    rc.zadd(keys.LEASES, {head: int((now + 3600) * 1000)}, xx=True)
    # ... by an owner that no longer holds it, is dead, or is unknown.
    if cause == "not_running":
        rc.srem(keys.process_held(proc), head)
        rc.zadd(keys.PROCS, {proc: int((now + 3600) * 1000)})
    elif cause == "owner_dead":
        rc.zadd(keys.PROCS, {proc: int(now * 1000) - 1})
    else:
        rc.zrem(keys.PROCS, proc)
    before = _repaired(rc, lane, cause)

    _audit_until(rc, int(now * 1000))

    assert _repaired(rc, lane, cause) == before + 1
    assert rc.hget(head, "st") == b"queued" and sum(rc.llen(q) for q in keys.lane_queues(lane)) == 1
    # A new delivery claims it; the old owner's late finish is fenced; the new one hands the chat on.
    later = now + 20
    assert _claim(head, task_id, chat, "new-host:1:1", later, 6000).status == "run"
    assert _finish(head, task_id, chat, owner, later).status == "taken"
    assert rc.lindex(keys.chat_queue(chat), 0).decode() == task_id
    assert _finish(head, task_id, chat, "new-host:1:1", later).status == "ok"
    assert rc.lindex(keys.chat_queue(chat), 0).decode() == sent[1].task_id
    assert rc.hget(keys.task_record(sent[1].task_id, chat), "st") == b"queued"
    rc.zrem(keys.PROCS, proc)


def test_a_running_head_of_a_live_owner_that_holds_it_is_left_alone(rc):
    name, lane = unique("live-head"), unique("l-live")
    define(name, lane=lane, chat_scoped=True, attempt_timeout=ATTEMPT_S, timeout=600)
    chat = unique("chat")
    sent = dispatch.delay(name, {}, chat_id=chat)
    head = keys.task_record(sent.task_id, chat)
    proc = f"live-{unique('h')}:4242"
    now = time.time()
    assert _claim(head, sent.task_id, chat, f"{proc}:1", now, 3_600_000).status == "run"
    rc.zadd(keys.PROCS, {proc: int((now + 3600) * 1000)})
    _audit_until(rc, int(now * 1000))
    assert rc.hget(head, "st") == b"running" and not LaneEvent.objects.filter(lane=lane).exists()
    rc.zrem(keys.PROCS, proc)
