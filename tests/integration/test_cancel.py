"""Cancel (issue 18): what a cancel leaves in Redis, the REVOKED row, and what it answers.

No worker consumes these lanes: every task stays waiting, so each assertion is
about the state a cancel leaves behind (tests/integration/test_cancel_workers.py
runs the same doors against real workers and the loopback sink).
"""

from __future__ import annotations

import uuid

import pytest
from celery.exceptions import TaskRevokedError
from django_celery_results.models import TaskResult

from lanes import keys, records
from tasks import cancel as cancelling
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, unique


def waiting_counts(rc, lane: str) -> dict[str, int]:
    """Everything that counts a lane's waiting tasks (admission's depth is their sum)."""
    return {"lists": lane_depth(rc, lane), "delayed": rc.zcard(keys.lane_delayed(lane)),
            "chat_waiting": int(rc.get(keys.lane_chat_waiting(lane)) or 0),
            "limited": int(rc.get(keys.lane_limited(lane)) or 0)}


def cancelled_count(rc, lane: str, name: str) -> int:
    return int(rc.hget(keys.METRICS_TOTAL, f"cancelled|{lane}|{name}") or 0)


def test_a_queued_task_is_removed_recorded_revoked_and_a_second_cancel_says_so(rc):
    name, lane = unique("c"), unique("lc")
    define(name, lane=lane)
    kept = dispatch.delay(name, {"n": 0})
    r = dispatch.delay(name, {"n": 1})
    assert waiting_counts(rc, lane)["lists"] == 2
    found = r.cancel("user deleted it", by="test")
    assert found.outcome == "cancelled" and found.cancelled
    assert "cancelled by test: user deleted it" in found.detail
    assert waiting_counts(rc, lane) == {"lists": 1, "delayed": 0, "chat_waiting": 0, "limited": 0}
    record = keys.task_record(r.task_id)
    assert not rc.exists(record) and rc.zscore(keys.DEADLINES, record) is None
    assert rc.zscore(keys.LEASES, record) is None
    assert rc.zscore(keys.DEADLINES, keys.task_record(kept.task_id)) is not None  # the other one is untouched
    row = TaskResult.objects.get(task_id=r.task_id)
    assert row.status == "REVOKED" and "user deleted it" in row.result and "test" in row.result
    with pytest.raises(TaskRevokedError, match="user deleted it"):
        r.get(timeout=5)
    assert cancelled_count(rc, lane, name) == 1
    again = dispatch.cancel(r.task_id, "again")
    assert again.outcome == "already_cancelled"
    assert cancelled_count(rc, lane, name) == 1
    # Once Redis forgot it too (tombstone gone), the row still answers.
    rc.delete(keys.tombstone(r.task_id))
    assert dispatch.cancel(r.task_id).outcome == "already_cancelled"


def test_unknown_and_invalid_ids_are_answers_never_exceptions():
    assert dispatch.cancel(str(uuid.uuid4())).outcome == "unknown"
    for bad in ("", "a:b", "{x}", "x" * 300, None, 12, "\x00", "\ud800"):
        assert dispatch.cancel(bad).outcome == "invalid", bad
    assert dispatch.cancel_chat("").pop().outcome == "invalid"
    assert dispatch.cancel_key("", "k").outcome == "invalid"
    assert dispatch.cancel_key(unique("nope"), "k").outcome == "unknown"


def test_a_finished_task_answers_already_done(rc):
    task_id = str(uuid.uuid4())
    rc.set(keys.tombstone(task_id), 'done|{"ok": 1}', ex=60)
    found = dispatch.cancel(task_id)
    assert found.outcome == "already_done" and "ok" in found.detail
    rc.set(keys.tombstone(task_id), 'dead|"dead letter (non_retryable)"', ex=60)
    assert dispatch.cancel(task_id).outcome == "already_dead"


def chat_of(rc, chat: str) -> list[str]:
    return [x.decode() for x in rc.lrange(keys.chat_queue(chat), 0, -1)]


def test_a_chats_middle_message_leaves_its_queue_and_a_cancelled_head_hands_over(rc):
    name, lane, chat = unique("cc"), unique("lcc"), unique("chat")
    define(name, lane=lane, chat_scoped=True)
    ids = [dispatch.delay(name, {"n": i}, chat_id=chat).task_id for i in range(4)]
    assert waiting_counts(rc, lane)["lists"] == 1 and waiting_counts(rc, lane)["chat_waiting"] == 3
    # A cancel by task id alone finds a chat's record among the live ones (no key written for it).
    assert records.locate(rc, ids[3]) == keys.task_record(ids[3], chat)
    assert dispatch.cancel(ids[2], "middle").outcome == "cancelled"
    assert chat_of(rc, chat) == [ids[0], ids[1], ids[3]]
    assert waiting_counts(rc, lane) == {"lists": 1, "delayed": 0, "chat_waiting": 2, "limited": 0}
    assert rc.zscore(keys.chat_index(), chat) == 3
    # The head (published, waiting in the lane list) is cancelled: its chat is handed to the next message.
    assert dispatch.cancel(ids[0], "head").outcome == "cancelled"
    assert chat_of(rc, chat) == [ids[1], ids[3]]
    assert waiting_counts(rc, lane) == {"lists": 1, "delayed": 0, "chat_waiting": 1, "limited": 0}
    copy = rc.lindex(keys.lane_queue(lane, 4), 0) or b"".join(rc.lindex(q, 0) or b"" for q in keys.lane_queues(lane))
    assert ids[1].encode() in copy and ids[0].encode() not in copy
    assert rc.hget(keys.task_record(ids[1], chat), "st") == b"queued"
    # Everything left, in one step.
    found = dispatch.cancel_chat(chat, "chat closed")
    assert sorted(f.task_id for f in found) == sorted([ids[1], ids[3]])
    assert {f.outcome for f in found} == {"cancelled"}
    assert waiting_counts(rc, lane) == {"lists": 0, "delayed": 0, "chat_waiting": 0, "limited": 0}
    assert not rc.exists(keys.chat_queue(chat)) and rc.zscore(keys.chat_index(), chat) is None
    assert not [k for k in rc.scan_iter(f"dispatch:chat:{{{chat}}}*")]
    assert cancelled_count(rc, lane, name) == 4
    assert {r.status for r in TaskResult.objects.filter(task_id__in=ids)} == {"REVOKED"}
    # A new message of the chat runs again (the chat is free).
    after = dispatch.delay(name, {"n": 9}, chat_id=chat)
    assert after.accepted and after.position == 1 and waiting_counts(rc, lane)["lists"] == 1


def test_a_retry_waiting_task_leaves_the_delayed_set(rc):
    name, lane, chat = unique("cr"), unique("lcr"), unique("chat")
    define(name, lane=lane, chat_scoped=True)
    first = dispatch.delay(name, {"n": 0}, chat_id=chat)
    second = dispatch.delay(name, {"n": 1}, chat_id=chat)
    record = keys.task_record(first.task_id, chat)
    # As retry.lua parks it: out of the lane list, into the delayed set.
    for q in keys.lane_queues(lane):
        rc.delete(q)
    rc.hset(record, mapping={"st": "retry", "att": "2"})
    rc.zadd(keys.lane_delayed(lane), {record: 1e13})
    assert dispatch.cancel(first.task_id).outcome == "cancelled"
    assert rc.zcard(keys.lane_delayed(lane)) == 0
    assert chat_of(rc, chat) == [second.task_id]
    assert rc.hget(keys.task_record(second.task_id, chat), "st") == b"queued"
    assert waiting_counts(rc, lane) == {"lists": 1, "delayed": 0, "chat_waiting": 0, "limited": 0}


def test_a_running_task_is_told_not_removed(rc):
    name, lane = unique("ct"), unique("lct")
    define(name, lane=lane)
    r = dispatch.delay(name, {"n": 0})
    record = keys.task_record(r.task_id)
    rc.hset(record, "st", "running")
    found = dispatch.cancel(r.task_id, "stop")
    assert found.outcome == "running_told"
    assert rc.hget(record, "st") == b"running" and b"stop" in rc.hget(record, "cx")
    assert dispatch.cancel(r.task_id).outcome == "running_told"  # idempotent
    assert not TaskResult.objects.filter(task_id=r.task_id).exists()


def test_cancel_by_idempotency_key(rc):
    name, lane = unique("ck"), unique("lck")
    define(name, lane=lane)
    r = dispatch.delay(name, {"n": 0}, idempotency_key="order-1")
    found = dispatch.cancel_key(name, "order-1", "stop")
    assert found.task_id == r.task_id and found.outcome == "cancelled"
    # The key still names the cancelled task: a retried dispatch is its duplicate, not a new task.
    again = dispatch.delay(name, {"n": 0}, idempotency_key="order-1")
    assert again.duplicate and again.task_id == r.task_id
    assert dispatch.cancel_key(name, "order-1").outcome == "already_cancelled"


def test_purge_lane_cancels_what_waits_and_leaves_running_tasks_and_other_lanes(rc):
    name, lane, other = unique("cp"), unique("lcp"), unique("lco")
    define(name, lane=lane, chat_scoped=True)
    define(name + "-o", lane=other)
    chat = unique("chat")
    waiting = [dispatch.delay(name, {"n": i}, chat_id=chat).task_id for i in range(3)]
    waiting += [dispatch.delay(name, {"n": i}, chat_id=unique("chat")).task_id for i in range(5)]
    elsewhere = dispatch.delay(name + "-o", {"n": 0})
    summary = cancelling.purge_lane(lane, "purge", by="test")
    assert summary.cancelled == 8
    assert waiting_counts(rc, lane) == {"lists": 0, "delayed": 0, "chat_waiting": 0, "limited": 0}
    assert not rc.exists(keys.chat_queue(chat))
    assert rc.zscore(keys.DEADLINES, keys.task_record(elsewhere.task_id)) is not None
    assert lane_depth(rc, other) == 1


def test_a_limited_task_leaves_its_limit_and_a_cancelled_holder_frees_its_slot(rc):
    from tests.integration.test_limits_scripts import limit, limited_type

    lane = unique("lcl")
    lim = limit(unique("cl"), scope="global", max_in_flight=1)
    tt = limited_type(unique("cl"), [lim], lane)
    first, second, third = (dispatch.delay(tt.name, {"n": i}) for i in range(3))
    base = keys.limit_base(lim.name)
    assert rc.smembers(keys.limit_holding(base)) == {keys.task_record(first.task_id).encode()}
    assert waiting_counts(rc, lane) == {"lists": 1, "delayed": 0, "chat_waiting": 0, "limited": 2}
    # A task waiting on the limit: out of its waiting set and the lane's limited count.
    assert second.cancel().outcome == "cancelled"
    assert rc.zrange(keys.limit_waiting(base), 0, -1) == [keys.task_record(third.task_id).encode()]
    assert waiting_counts(rc, lane) == {"lists": 1, "delayed": 0, "chat_waiting": 0, "limited": 1}
    # The holder (published, not started): its slot goes to the next waiting task in the same step.
    assert first.cancel().outcome == "cancelled"
    assert rc.smembers(keys.limit_holding(base)) == {keys.task_record(third.task_id).encode()}
    assert waiting_counts(rc, lane) == {"lists": 1, "delayed": 0, "chat_waiting": 0, "limited": 0}
    assert rc.hget(keys.task_record(third.task_id), "st") == b"queued"
    assert third.cancel().outcome == "cancelled"
    assert not rc.exists(keys.limit_holding(base), keys.limit_waiting(base), keys.lane_limited(lane))
    assert rc.zscore(keys.limit_instances(lim.name), base) is None


def test_http_post_checks_ctx_cancelled_before_sending(rc, sink):
    import time

    from tasks.context import Context
    from tasks.errors import TaskCancelled
    from tasks.handlers.http import post

    record = keys.task_record(unique("t"))
    ctx = Context(task_id="t1", type="x", lane="l", chat_id="", attempt=1, deadline=time.time() + 30,
                  attempt_deadline=time.time() + 10, idempotency_key="k1", options={"url": sink.url},
                  _record=record)
    rc.hset(record, "st", "running")
    assert not ctx.cancelled
    assert post({"n": 1}, ctx) == {"status": 200}
    rc.hset(record, "cx", "cancelled by test")
    assert ctx.cancelled
    with pytest.raises(TaskCancelled):
        post({"n": 2}, ctx)
    assert [a.body for a in sink.sink.attempts] == [{"n": 1}]  # the second was never sent
    assert not Context(task_id="t2", type="x", lane="l", chat_id="", attempt=1, deadline=0, attempt_deadline=0,
                       idempotency_key="k").cancelled  # outside a worker: never cancelled


def test_a_cancel_sends_the_task_finished_hook_with_outcome_cancelled(rc):
    from tasks.signals import task_finished

    name, lane, chat = unique("ch"), unique("lch"), unique("chat")
    define(name, lane=lane, chat_scoped=True)
    r = dispatch.delay(name, {"n": 0}, chat_id=chat)
    seen = []

    def receiver(sender, info, **_):
        seen.append(info)

    task_finished.connect(receiver, weak=False)
    try:
        assert r.cancel("why").outcome == "cancelled"
    finally:
        task_finished.disconnect(receiver)
    [info] = seen
    assert (info.task_id, info.type, info.lane, info.chat_id, info.outcome) == (r.task_id, name, lane, chat,
                                                                               "cancelled")
    assert "why" in info.detail


def test_with_task_events_on_a_cancel_sends_task_revoked_for_flower():
    import threading

    from celery import current_app

    app = current_app._get_current_object()
    got: list[dict] = []
    ready = threading.Event()

    receivers = []

    def listen() -> None:
        with app.connection_for_read() as conn:
            receiver = app.events.Receiver(conn, handlers={"task-revoked": got.append})
            receivers.append(receiver)
            ready.set()
            receiver.capture(limit=None, timeout=None, wakeup=False)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(5)
    import time

    from tasks.results import announce_revoked

    sent: list[str] = []
    previous = app.conf.worker_send_task_events
    app.conf.worker_send_task_events = True
    try:
        # Redis fanout is pub/sub: announce until the receiver (subscribing in its thread) hears one.
        while not got and len(sent) < 40:
            sent.append(str(uuid.uuid4()))
            announce_revoked(sent[-1])
            time.sleep(0.25)
    finally:
        app.conf.worker_send_task_events = previous
    receivers[0].should_stop = True
    thread.join(15)
    assert got and got[0]["uuid"] in sent and got[0]["type"] == "task-revoked"
    sent_off = str(uuid.uuid4())
    announce_revoked(sent_off)  # events off (the setting): nothing is sent, nothing raised
