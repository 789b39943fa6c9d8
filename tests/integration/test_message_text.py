"""The text the scripts read: ``pop_more.lua`` names the record of every leased message it takes, a
chat id in any script included, whether the lane list names the record (the platform's publish) or
holds a whole message (one handed back by a worker: the record's key read from its raw text)."""

from __future__ import annotations

import orjson
import pytest

from lanes import keys, leases
from lanes.lua.pop_more import pop_more
from lanes.messages import Envelope, build_message, kombu_message
from tests.support.helpers import unique


@pytest.mark.parametrize("chat", ["plain-chat", "café", "チャット-42", "emoji 🚀"])
def test_pop_more_names_the_record_of_a_chat_in_any_script(rc, chat):
    lane = unique("msgtext")
    lists = keys.lane_queues(lane)
    in_hand = keys.process_in_hand(leases.process_id())
    rc.delete(in_hand)
    task_id = unique("t")
    envelope = Envelope(type="chat.send", lane=lane, priority=5, attempt=1, deadline=2e9, dispatched_at=1e9, chat=chat)
    stored = build_message(task_id, "http.post", '{"text":"héllo"}', envelope, 10.0)
    record = keys.task_record(task_id, chat)
    whole = kombu_message(stored, task_id, record, f"{task_id}.1")
    rc.hset(record, mapping={"msg": stored, "pub": 2})
    rc.lpush(lists[0], f"{record}#1".encode(), f"{record}#2".encode(), orjson.dumps(whole))  # popped in this order
    popped = pop_more(rc, lane, lists, 10, None)
    # The stale copy (#1: the record was published again since) is dropped; the last copy and the
    # whole message are delivered, each naming its record.
    assert [(p.record, p.tag) for p in popped] == [(record, f"{task_id}.2"), (record, "")]
    assert popped[0].message == stored.encode() and orjson.loads(popped[1].message) == whole
    assert {m.decode() for m in rc.smembers(in_hand)} == {record}
    rc.delete(in_hand, keys.lane_doorbell(lane), record, *lists)
