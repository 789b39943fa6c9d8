"""Cancel a task sent for later (issue 18's countdown / eta): it never runs, its chat moves on."""

from __future__ import annotations

from django_celery_results.models import TaskResult

from lanes import keys
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, unique, wait_for_redelivery_room, wait_until


def test_a_scheduled_task_and_a_scheduled_message_behind_its_head_are_cancelled(rc):
    name, lane, chat = unique("cs"), unique("lcs"), unique("chat")
    define(name, lane=lane, chat_scoped=True, timeout=600)
    plain = define(name + "-p", lane=lane, timeout=600).name
    later = dispatch.delay(plain, {"n": 0}, countdown=300)
    assert rc.hget(keys.task_record(later.task_id), "st") == b"scheduled"
    assert rc.zscore(keys.lane_delayed(lane), keys.task_record(later.task_id)) is not None
    assert later.cancel("not wanted").outcome == "cancelled"
    assert rc.zcard(keys.lane_delayed(lane)) == 0
    # A chat: a scheduled head (in the delayed set), a scheduled message behind a head, a plain one last.
    head = dispatch.delay(name, {"n": 0}, chat_id=chat, countdown=300)
    behind = dispatch.delay(name, {"n": 1}, chat_id=chat, countdown=300)
    last = dispatch.delay(name, {"n": 2}, chat_id=chat)
    assert int(rc.get(keys.lane_chat_waiting(lane))) == 2
    assert behind.cancel().outcome == "cancelled"
    assert int(rc.get(keys.lane_chat_waiting(lane))) == 1
    assert head.cancel().outcome == "cancelled"  # the chat is handed to the plain message: published now
    assert [x.decode() for x in rc.lrange(keys.chat_queue(chat), 0, -1)] == [last.task_id]
    assert rc.hget(keys.task_record(last.task_id, chat), "st") == b"queued"
    assert lane_depth(rc, lane) == 1 and rc.zcard(keys.lane_delayed(lane)) == 0
    assert not rc.exists(keys.lane_chat_waiting(lane))
    assert {r.status for r in TaskResult.objects.filter(task_id__in=[later.task_id, head.task_id, behind.task_id])} \
        == {"REVOKED"}


def test_a_cancelled_scheduled_task_never_reaches_the_sink(start_worker, sink, rc):
    name, lane = unique("cw"), unique("lcw")
    define(name, handler="http.post", lane=lane, options={"url": sink.url}, timeout=120)
    start_worker(lane, pool="threads", concurrency=2)
    soon = dispatch.delay(name, {"n": 0}, countdown=2)
    kept = dispatch.delay(name, {"n": 1}, countdown=2)
    assert soon.cancel().outcome == "cancelled"
    wait_until(lambda: sink.sink.applied.get(kept.task_id), timeout=30, what="the kept one run when due")
    wait_for_redelivery_room(rc, lane, 1.0, (keys.task_record(soon.task_id), keys.task_record(kept.task_id)))
    assert not sink.sink.attempts_for(soon.task_id)
