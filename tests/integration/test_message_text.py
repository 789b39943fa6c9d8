"""The message's raw text as the scripts read it: ``pop_more.lua`` names the record of every leased
message it takes, a chat id in any script included (the record's key is written raw, in UTF-8)."""

from __future__ import annotations

import pytest

from lanes import keys, leases
from lanes.lua.pop_more import pop_more
from lanes.messages import Envelope, build_message
from tests.support.helpers import unique


@pytest.mark.parametrize("chat", ["plain-chat", "café", "チャット-42", "emoji 🚀"])
def test_pop_more_names_the_record_of_a_chat_in_any_script(rc, chat):
    lane = unique("msgtext")
    lists = keys.lane_queues(lane)
    in_hand = keys.process_in_hand(leases.process_id())
    rc.delete(in_hand)
    task_id = unique("t")
    envelope = Envelope(type="chat.send", lane=lane, priority=5, attempt=1, deadline=2e9, dispatched_at=1e9, chat=chat)
    message = build_message(task_id, "http.post", '{"text":"héllo"}', envelope, 10.0).replace("\0", "tag", 1)
    rc.lpush(lists[0], message)
    popped = pop_more(rc, lane, lists, 10, None)
    record = keys.task_record(task_id, chat)
    assert [got for _item, got in popped] == [record]
    assert {m.decode() for m in rc.smembers(in_hand)} == {record}
    rc.delete(in_hand, keys.lane_doorbell(lane), *lists)
