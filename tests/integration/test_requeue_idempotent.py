"""Issue 12: requeuing a dead letter is idempotent per row, even when the first attempt's outcome was lost."""

from __future__ import annotations

import pytest
import redis
from django.db import DatabaseError

from lanes import counters, keys
from tasks import dead_letters
from tasks.models import DeadLetter
from tests.support.helpers import define, lane_depth, unique


def _dead_row(idempotency_key: str = "", chat: bool = False) -> DeadLetter:
    """A dead letter of a type whose lane no worker serves, so requeued tasks stay countable in Redis."""
    name, lane = unique("rq-type"), unique("rq-lane")
    define(name, lane=lane, chat_scoped=chat)
    return dead_letters.record(task_id=unique("rq-task"), task_type=name, lane=lane, reason="exhausted",
                               payload={"order": 7}, idempotency_key=idempotency_key,
                               chat_id=unique("chat") if chat else "", attempts=3)


def _dispatched(rc, row: DeadLetter) -> int:
    counters.flush()  # admissions are counted in this process, written in batches (lanes.counters)
    return int(rc.hget(keys.METRICS_TOTAL, f"dispatched|{row.lane}|{row.task_type}") or 0)


def _fail_first_row_update(monkeypatch) -> None:
    """The row's update after admission fails once, as a failed commit would: the row stays dead."""
    real_save = DeadLetter.save
    state = {"failed": False}

    def save(self, *args, **kwargs):
        if not state["failed"] and kwargs.get("update_fields") and "requeued_task_id" in kwargs["update_fields"]:
            state["failed"] = True
            raise DatabaseError("simulated: commit lost")
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(DeadLetter, "save", save)


@pytest.mark.parametrize("key", ["", "order-7"], ids=["no-key", "with-key"])
def test_requeue_after_a_lost_db_update_makes_one_task(rc, monkeypatch, key):
    row = _dead_row(idempotency_key=unique(key) if key else "")
    _fail_first_row_update(monkeypatch)
    with pytest.raises(DatabaseError):
        dead_letters.requeue(row, actor="op")
    row.refresh_from_db()
    assert row.status == "dead" and not row.requeued_task_id
    assert _dispatched(rc, row) == 1 and lane_depth(rc, row.lane) == 1  # the first attempt did admit a task

    task_id = dead_letters.requeue(row, actor="op")
    row.refresh_from_db()
    assert row.status == "requeued" and row.requeued_task_id == task_id
    assert _dispatched(rc, row) == 1 and lane_depth(rc, row.lane) == 1  # exactly one new task
    with pytest.raises(dead_letters.RequeueError, match="already requeued"):
        dead_letters.requeue(row, actor="op")


def test_requeue_after_an_unknown_redis_outcome_makes_one_task(rc, monkeypatch):
    from lanes.lua import admit as admit_wrapper

    row = _dead_row(chat=True)
    real_receive = admit_wrapper.Calls.receive
    state = {"timed_out": False}

    def receive(self):
        replies = real_receive(self)
        if not state["timed_out"]:
            state["timed_out"] = True  # the script ran, but its answer never arrived
            return [redis.TimeoutError("simulated: Timeout reading from socket")] * len(replies)
        return replies

    # The one place admit.lua's replies come back (a reply is the error its call met: Calls never raises).
    monkeypatch.setattr(admit_wrapper.Calls, "receive", receive)
    with pytest.raises(dead_letters.RequeueError, match="outcome unknown"):
        dead_letters.requeue(row, actor="op")
    assert rc.llen(keys.chat_queue(row.chat_id)) == 1  # the script ran: its task is there

    task_id = dead_letters.requeue(row, actor="op")
    row.refresh_from_db()
    assert row.status == "requeued" and row.requeued_task_id == task_id
    # 'dispatched' is counted by the caller on an 'ok' reply (lanes.counters): the lost
    # reply is counted by nobody, the retry's 'dup' neither; never twice.
    assert _dispatched(rc, row) <= 1 and lane_depth(rc, row.lane) == 1
    assert rc.llen(keys.chat_queue(row.chat_id)) == 1  # the chat holds the one task, not two


def test_requeue_of_a_task_that_already_finished_links_it(rc, monkeypatch):
    """The first requeue's task ran to its end (record forgotten, result stored) before the retry."""
    from django_celery_results.models import TaskResult

    row = _dead_row()
    new_id = dead_letters.requeue_task_id(row)
    TaskResult.objects.create(task_id=new_id, status="SUCCESS")
    assert dead_letters.requeue(row, actor="op") == new_id
    assert _dispatched(rc, row) == 0 and lane_depth(rc, row.lane) == 0
