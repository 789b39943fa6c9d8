"""claim_group.lua's one call per group: the successes gathered since the last call finish first, then the
delivered messages are claimed, each as its single script would (finish.lua, start.lua), on the session's Redis."""

from __future__ import annotations

import time

from lanes import keys
from lanes.lua.claim_group import FinishTerms, GroupItem, claim_group
from lanes.lua.finish_batch import DoneItem
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique

PROCESS = "test-group-call:1"
TERMS = {"lease_ms": 30_000, "max_deliveries": 5, "process": PROCESS, "liveness_ms": 5_000}
FINISH = FinishTerms(tombstone_ttl_s=60, queued_lease_ms=120_000, settle_lease_ms=10_000)


def _call(claims: list[GroupItem], done: list[DoneItem] | None = None):
    return claim_group(items=claims, now=time.time(), counts=[("x|y", "", 0.0)] * len(claims), done=done or [],
                       finish=FINISH, **TERMS)


def test_one_call_finishes_a_chat_head_then_claims_its_successor(rc):
    type_name, chat = unique("gcall"), unique("c")
    define(type_name, lane=unique("gcall"), chat_scoped=True)
    first, second = (dispatch.delay(type_name, {"n": n}, chat_id=chat) for n in range(2))
    assert first.accepted and second.accepted
    rec1, rec2 = keys.task_record(first.task_id, chat), keys.task_record(second.task_id, chat)

    a = _call([GroupItem(first.task_id, rec1, 1, f"{PROCESS}:g1", chat)])
    assert [c.status for c in a.claims] == ["run"] and a.finished == []
    # Claimed alone, the successor is not its chat's head yet.
    assert [c.status for c in _call([GroupItem(second.task_id, rec2, 1, f"{PROCESS}:g2", chat)]).claims] == ["nothead"]
    # A finish by an owner that did not claim it changes nothing.
    assert _call([], [DoneItem(first.task_id, rec1, chat, '"x"', f"{PROCESS}:other")]).finished == ["taken"]

    b = _call([GroupItem(second.task_id, rec2, 1, f"{PROCESS}:g3", chat)],
              [DoneItem(first.task_id, rec1, chat, '"one"', f"{PROCESS}:g1")])
    assert b.finished == ["ok"] and [c.status for c in b.claims] == ["run"]
    assert rc.hget(rec1, "st") == b"done" and rc.get(keys.tombstone(first.task_id)) == b'done|"one"'
    assert rc.hget(rec2, "st") == b"running" and rc.hget(rec2, "own") == f"{PROCESS}:g3".encode()

    # The hand-over counted the chat down in the active chats index (its successor still queued).
    assert rc.zscore(keys.chat_index(), chat) == 1
    # Finished alone (no claims: no config read), the chat's last message leaves its queue and the index; a
    # success of a type that keeps its result row ('' for its tombstone: tasks.results.keeps_row) writes none.
    c = _call([], [DoneItem(second.task_id, rec2, chat, '"two"', f"{PROCESS}:g3", "")])
    assert c.finished == ["ok"] and c.claims == [] and c.config_version == ""
    assert not rc.exists(keys.chat_queue(chat)) and rc.zscore(keys.chat_index(), chat) is None
    assert rc.hget(rec2, "st") == b"done" and rc.hget(rec2, "res") == b'"two"'
    assert not rc.exists(keys.tombstone(second.task_id))
    rc.delete(rec1, rec2)
    rc.zrem(keys.LEASES, rec1, rec2)
    rc.srem(keys.process_held(PROCESS), rec1, rec2)
