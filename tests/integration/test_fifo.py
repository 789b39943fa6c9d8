"""Per-chat FIFO and admission: order under stress, crashes, bounds, idempotency, priorities."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from django.test import override_settings

from lanes import keys
from lanes.messages import listed_message
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, unique, wait_for_redelivery_room, wait_until


def chat_keys(rc, chats: list[str]) -> list[bytes]:
    """Every Redis key that belongs to one of ``chats`` (queue or task records)."""
    prefixes = tuple(keys.chat_queue(c).encode() for c in chats) + tuple(
        keys.chat_record_prefix(c).encode() for c in chats)
    return [k for k in rc.scan_iter("dispatch:chat:*", count=1000) if k.startswith(prefixes)]


def diagnose(rc, lane: str, sink) -> str:
    """What is stuck where, printed when a drain times out."""
    lines = [f"applied={len(sink.sink.applied)} attempts={len(sink.sink.attempts)}",
             f"lists={ {k: rc.llen(k) for k in keys.lane_queues(lane) if rc.llen(k)} }",
             f"delayed={rc.zcard(keys.lane_delayed(lane))} leases={rc.zcard(keys.LEASES)}",
             f"unacked={rc.hlen('unacked')} chats_index={rc.zcard(keys.chat_index())}"]
    for chat, _ in rc.zrange(keys.chat_index(), 0, 5, withscores=True):
        chat = chat.decode()
        head = rc.lindex(keys.chat_queue(chat), 0)
        record = keys.task_record(head.decode(), chat) if head else None
        state = rc.hgetall(record) if record else {}
        state.pop(b"msg", None)
        lines.append(f"chat {chat}: len={rc.llen(keys.chat_queue(chat))} head={head} "
                     f"lease={rc.zscore(keys.LEASES, record) if record else None} state={state}")
    return "\n".join(lines)


def drained(rc, lane: str) -> bool:
    return lane_depth(rc, lane) == 0 and rc.zcard(keys.lane_delayed(lane)) == 0


def test_order_under_stress_many_chats_two_workers(start_worker, sink, rc):
    """80 chats x 20 messages, 2 worker processes x 6 threads, 10% of first attempts fail."""
    name, lane = unique("stress"), unique("l-stress")
    define(name, handler="http.post", lane=lane, chat_scoped=True, chat_queue_size=64,
           options={"url": sink.url}, timeout=300,
           policy={"max_retries": 10, "initial_backoff": 0.05, "multiplier": 2.0, "max_backoff": 0.5})
    sink.sink.behaviour.delay_s = (0.0, 0.02)
    sink.sink.behaviour.fail_fraction_first = 0.10
    workers = start_worker.many(2, lane, pool="threads", concurrency=6)
    chats, per_chat = 80, 20
    accepted: dict[str, list[str]] = {}

    def send(chat_numbers: list[int]) -> None:
        for seq in range(per_chat):
            for n in chat_numbers:
                chat = f"chat-{n}"
                result = dispatch.delay(name, {"seq": seq, "chat": chat}, chat_id=chat,
                                        idempotency_key=f"{chat}-{seq}")
                assert result.accepted, result
                accepted.setdefault(chat, []).append(result.task_id)

    groups = [list(range(i, chats, 8)) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, groups))
    total = chats * per_chat
    assert sum(len(v) for v in accepted.values()) == total
    try:
        wait_until(lambda: sum(sink.sink.applied.values()) >= total and drained(rc, lane), timeout=240,
                   interval=0.5, what="all messages delivered")
    except AssertionError:
        print(diagnose(rc, lane, sink))
        for worker in workers:  # their threads' stacks go to the worker logs (kept as test artifacts)
            worker.dump_stacks()
        time.sleep(1.0)
        raise
    time.sleep(0.5)
    assert len(sink.sink.applied) == total  # every accepted message delivered
    assert all(n == 1 for n in sink.sink.applied.values())  # the sink saw each key applied once
    for n in range(chats):
        assert sink.sink.order[f"chat-{n}"] == list(range(per_chat)), f"chat-{n} out of order"
    assert sink.sink.overlaps == []  # never two messages of one chat in flight at once
    retried = [a for a in sink.sink.attempts if a.status == 500]
    assert retried, "the sink was meant to fail some first attempts"
    all_chats = [f"chat-{n}" for n in range(chats)]
    wait_until(lambda: not chat_keys(rc, all_chats), timeout=10, what="no chat key left")
    assert not {m.decode() for m in rc.zrange(keys.chat_index(), 0, -1)} & set(all_chats)
    assert not rc.get(keys.lane_chat_waiting(lane))


def test_worker_killed_mid_message_chat_completes_in_order(start_worker, sink, rc):
    name, lane = unique("killed"), unique("l-kill")
    define(name, handler="http.post", lane=lane, chat_scoped=True, options={"url": sink.url}, timeout=120,
           attempt_timeout=30)
    sink.sink.behaviour.delay_s = (0.8, 0.8)  # long enough to be caught in flight; five run after the crash
    victim = start_worker(lane, concurrency=1)
    results = [dispatch.delay(name, {"seq": i}, chat_id="kill-chat") for i in range(5)]
    assert all(r.accepted for r in results)
    wait_until(lambda: sink.sink.in_flight.get("kill-chat"), timeout=20, what="first message in flight")
    victim.kill()  # SIGKILL main process and pool child
    start_worker(lane, concurrency=1)
    wait_until(lambda: len(sink.sink.order.get("kill-chat", [])) == 5, timeout=90, interval=0.2,
               what="chat to complete after the crash")
    assert sink.sink.order["kill-chat"] == [0, 1, 2, 3, 4]
    assert sink.sink.overlaps == []
    first_key = results[0].task_id
    attempts = sink.sink.attempts_for(first_key)
    assert 1 <= len(attempts) <= 2 and all(a.headers["Idempotency-Key"] == first_key for a in attempts)
    wait_until(lambda: not rc.exists(keys.chat_queue("kill-chat")), timeout=10, what="chat key gone")


def test_lost_publish_is_recovered_by_the_sweep_within_its_lease(start_worker, sink, rc):
    """The head's message vanishes from the broker (a publisher or broker fault); the sweep republishes it."""
    name, lane = unique("lost"), unique("l-lost")
    define(name, handler="http.post", lane=lane, chat_scoped=True, options={"url": sink.url})
    with override_settings(DISPATCH_QUEUED_LEASE_S=2.0):
        results = [dispatch.delay(name, {"seq": i}, chat_id="lost-chat") for i in range(3)]
    assert all(r.accepted for r in results)
    assert lane_depth(rc, lane) == 1  # only the head is ever in the broker
    for queue in keys.lane_queues(lane):
        rc.delete(queue)  # the published head is lost
    assert lane_depth(rc, lane) == 0
    started = time.monotonic()
    start_worker(lane, concurrency=1)  # its maintenance thread sweeps expired leases
    wait_until(lambda: sink.sink.order.get("lost-chat") == [0, 1, 2], timeout=40, interval=0.2,
               what="chat recovered by the sweep")
    assert time.monotonic() - started < 30
    # The sink sees the last message before its task finishes (the handler's POST comes first): the last
    # finish then removes the chat's queue (it failed once, read at once, on a loaded machine).
    wait_until(lambda: not rc.exists(keys.chat_queue("lost-chat")), timeout=10, interval=0.1,
               what="the chat's queue removed by its last task's finish")


def test_chat_audit_repairs_a_head_whose_record_vanished(rc, sink, start_worker):
    from tasks.maintenance import audit_chats

    name, lane = unique("audit"), unique("l-audit")
    define(name, handler="http.post", lane=lane, chat_scoped=True, options={"url": sink.url})
    results = [dispatch.delay(name, {"seq": i}, chat_id="audit-chat") for i in range(3)]
    rc.delete(keys.task_record(results[0].task_id, "audit-chat"))  # head record lost
    for queue in keys.lane_queues(lane):
        rc.delete(queue)
    checked, handed, _, _ = audit_chats()
    assert checked >= 1 and handed == 1
    start_worker(lane, concurrency=1)
    wait_until(lambda: sink.sink.order.get("audit-chat") == [1, 2], timeout=30, what="rest of the chat")


def test_bounded_lane_and_chat_queues(rc):
    name, lane = unique("bounded"), unique("l-bounded")
    define(name, lane=lane, capacity=5)
    results = [dispatch.delay(name, {"i": i}) for i in range(7)]
    assert [r.accepted for r in results] == [True] * 5 + [False] * 2
    assert {r.reason for r in results[5:]} == {"lane_full"}
    assert lane_depth(rc, lane) == 5

    chat_type, chat_lane = unique("chatbound"), unique("l-chatbound")
    define(chat_type, lane=chat_lane, chat_scoped=True, chat_queue_size=3)
    results = [dispatch.delay(chat_type, {"i": i}, chat_id="c-bound") for i in range(5)]
    assert [r.accepted for r in results] == [True, True, True, False, False]
    assert [r.position for r in results[:3]] == [1, 2, 3]
    assert {r.reason for r in results[3:]} == {"chat_queue_full"}
    assert rc.llen(keys.chat_queue("c-bound")) == 3
    assert lane_depth(rc, chat_lane) == 1  # the head only
    # Chat backlogs count toward the lane's capacity too.
    other = dispatch.delay(chat_type, {"i": 9}, chat_id="c-other")
    assert other.accepted and other.position == 1
    records = [k for k in rc.scan_iter("dispatch:chat:{c-bound}:t:*")]
    assert len(records) == 3  # nothing beyond the bound was stored


def test_lane_capacity_counts_chat_backlog(rc):
    name, lane = unique("capchat"), unique("l-capchat")
    define(name, lane=lane, chat_scoped=True, chat_queue_size=100, capacity=4)
    results = [dispatch.delay(name, {"i": i}, chat_id="cc") for i in range(6)]
    assert [r.accepted for r in results] == [True] * 4 + [False] * 2
    assert results[-1].reason == "lane_full"


def test_idempotent_dispatch_sequential_and_concurrent(rc):
    name, lane = unique("idem"), unique("l-idem")
    define(name, lane=lane)
    first = dispatch.delay(name, {"a": 1}, idempotency_key="order-1")
    again = dispatch.delay(name, {"a": 1}, idempotency_key="order-1")
    assert first.accepted and not first.duplicate
    assert again.accepted and again.duplicate and again.task_id == first.task_id
    conflict = dispatch.delay(name, {"a": 2}, idempotency_key="order-1")
    assert not conflict.accepted and conflict.reason == "idempotency_conflict"

    barrier = threading.Barrier(20)

    def racer(_):
        barrier.wait()
        return dispatch.delay(name, {"b": 1}, idempotency_key="race-1")

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(racer, range(20)))
    assert all(r.accepted for r in results)
    assert len({r.task_id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1
    assert lane_depth(rc, lane) == 2  # order-1 and race-1, once each


def test_priorities_high_first_then_fifo(start_worker, sink, rc):
    name, lane = unique("prio"), unique("l-prio")
    define(name, handler="http.post", lane=lane, options={"url": sink.url})
    # No worker serves the lane yet (as if paused): everything waits.
    for i in range(5):
        assert dispatch.delay(name, {"seq": f"low-{i}"}, priority=1).accepted
    for i in range(5):
        assert dispatch.delay(name, {"seq": f"high-{i}"}, priority=8).accepted
    assert dispatch.delay(name, {"seq": "mid-0"}, priority=5).accepted
    assert lane_depth(rc, lane) == 11
    start_worker(lane, concurrency=1)
    wait_until(lambda: len(sink.sink.attempts) == 11, timeout=60, what="all delivered")
    order = [a.body["seq"] for a in sink.sink.attempts]
    assert order == [f"high-{i}" for i in range(5)] + ["mid-0"] + [f"low-{i}" for i in range(5)]


def test_duplicate_delivery_of_a_finished_task_is_dropped_and_acked(start_worker, rc, sink):
    name, lane = unique("dupdeliv"), unique("l-dup")
    define(name, handler="http.post", lane=lane, options={"url": sink.url})
    # Capture the published message before a worker takes it: dispatch with no consumer first
    # (the dispatch pushes onto the lane's list whether or not a worker serves it).
    result = dispatch.delay(name, {"x": 1})
    queue = keys.lane_queue(lane, 4)
    item = rc.lrange(queue, 0, -1)[0]  # the list names the record
    whole = orjson.dumps(listed_message(rc, item))  # the message as a worker hands it back
    start_worker(lane, concurrency=1)
    result.get(timeout=20)
    from django_celery_results.models import TaskResult

    # As if the worker died after finishing but before Celery stored the result:
    TaskResult.objects.filter(task_id=result.task_id).delete()
    # The same message again, as a redelivery would bring it; and the list's copy, whose record is
    # settled now: the pop drops it (nothing left to run).
    rc.lpush(queue, whole, item)
    wait_until(lambda: lane_depth(rc, lane) == 0, timeout=20, what="duplicate consumed")
    row = wait_until(lambda: TaskResult.objects.filter(task_id=result.task_id).first(), what="result re-stored")
    assert row.status == "SUCCESS" and json.loads(row.result) == {"status": 200}
    wait_for_redelivery_room(rc, lane, 1.0, (keys.task_record(result.task_id),))
    assert len(sink.sink.attempts) == 1  # not run twice
    assert rc.hlen("unacked") == 0  # and acknowledged, not left for redelivery


BAD_CHATS = ["{brace}", "a}b{c", "ümlaut-чат", "x" * 128]
#: One lane per odd chat id, all served by one worker (``shared_worker``).
SHARED_LANES = {chat: unique("l-odd") for chat in BAD_CHATS}
SHARED_WORKER = {"pool": "threads", "concurrency": 4}


@pytest.mark.parametrize("bad_chat", BAD_CHATS)
def test_unusual_chat_ids_keep_fifo_and_leave_no_keys(shared_worker, sink, rc, bad_chat):
    name, lane = unique("odd"), SHARED_LANES[bad_chat]
    define(name, handler="http.post", lane=lane, chat_scoped=True, options={"url": sink.url})
    for i in range(5):
        assert dispatch.delay(name, {"seq": i}, chat_id=bad_chat).accepted
    wait_until(lambda: sink.sink.order.get(bad_chat) == [0, 1, 2, 3, 4], timeout=30, what="odd chat done")
    wait_until(lambda: not chat_keys(rc, [bad_chat]), timeout=10, what="no chat keys")
    assert rc.zscore(keys.chat_index(), bad_chat) is None
