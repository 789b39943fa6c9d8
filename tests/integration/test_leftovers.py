"""What a module left waiting in the session's Redis is settled at its end (tests/support/leftovers.py):
a later module's worker has nothing of it to expire inside that module's own counts (test_redis_budget)."""

from __future__ import annotations

from lanes import keys
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, unique
from tests.support.leftovers import settle_waiting


def test_tasks_left_waiting_are_cancelled_and_their_records_dropped(rc):
    lane = unique("l-left")
    plain, chat = unique("left"), unique("left-chat")
    define(plain, lane=lane)
    define(chat, lane=lane, chat_scoped=True)
    chat_id = unique("c")
    sent = [dispatch.delay(plain, {"i": 1}), dispatch.delay(plain, {"i": 2}, countdown=30),
            dispatch.delay(chat, {"i": 3}, chat_id=chat_id), dispatch.delay(chat, {"i": 4}, chat_id=chat_id)]
    assert all(r.accepted for r in sent)
    records = [keys.task_record(r.task_id, chat_id if i >= 2 else None) for i, r in enumerate(sent)]
    assert all(rc.zscore(keys.DEADLINES, record) is not None for record in records)

    assert settle_waiting(rc) >= len(sent)

    assert not any(rc.zscore(keys.DEADLINES, record) is not None for record in records)
    assert rc.exists(*records) == 0 and lane_depth(rc, lane) == 0 and rc.zcard(keys.lane_delayed(lane)) == 0
    assert rc.llen(keys.chat_queue(chat_id)) == 0
    assert not any(rc.zscore(keys.LEASES, record) is not None for record in records)
