"""The queued lease is written by the pop that takes a message, not by admission (docs/redis-budget.md,
docs/liveness.md): a message waiting in its lane list has none, a popped and unclaimed one has it from its pop,
and a copy lost from an empty list (no pop took it) is republished by the audit's walk of the waiting tasks.
Through the real scripts, on the session's Redis; counted, never timed."""

from __future__ import annotations

import time
from contextlib import contextmanager
from unittest import mock

from django.conf import settings

from lanes import keys, leases
from lanes.lua.pop_more import PopClaims, pop_more
from lanes.lua.sweep import sweep
from tasks.bulk import dispatch_many
from tasks.dispatch import dispatch
from tasks.maintenance import audit_chats
from tests.integration.test_doorbells import Monitor
from tests.support.helpers import define, unique

HANDLER = "demo.echo"
QUEUED_MS = int(settings.DISPATCH_QUEUED_LEASE_S * 1000)


@contextmanager
def as_process(proc: str):
    """pop_more names and claims for the calling process: here, a modelled worker's."""
    with mock.patch.object(leases, "process_id", lambda pid=None: proc), \
            mock.patch.object(leases.current(), "registered", lambda: True):
        yield


def _leases(rc, records: list[str]) -> list[float | None]:
    return rc.zmscore(keys.LEASES, records)


def _lease_zadds(monitor: Monitor, records: list[str]) -> list[str]:
    """The ZADDs of the leases set that name any of ``records``."""
    return [c["command"] for c in monitor.seen if c["command"].upper().startswith("ZADD")
            and keys.LEASES in c["command"] and any(r in c["command"] for r in records)]


def _audit_every_waiting_task(rc, now_ms: int) -> None:
    """The audit's walks from their start until the walk of the waiting tasks wraps."""
    cursor = getattr(keys, "WAITING_AUDIT_CURSOR", keys.PARKED_AUDIT_CURSOR)  # the parked one's before it
    rc.delete(keys.CHAT_AUDIT_CURSOR, keys.PARKED_AUDIT_CURSOR, cursor)
    for _ in range(10_000):
        audit_chats(batch=1000, now_ms=now_ms)
        if not int(rc.get(cursor) or 0):
            return


def test_admission_writes_no_queued_lease_and_the_pop_writes_it_for_what_it_takes_unclaimed(rc):
    type_name, lane = unique("ql"), unique("l-ql")
    define(type_name, lane=lane)
    with Monitor(rc) as monitor:
        one = [dispatch.delay(type_name, {"n": i}) for i in range(3)]
        many = dispatch_many(type_name, [{"n": i} for i in range(3, 6)])
    results = [*one, *many]
    assert all(r.accepted for r in results)
    records = [keys.task_record(r.task_id) for r in results]
    # Waiting in the lane list: in the deadlines set, no lease (admission's one ZADD is the deadline's).
    assert _lease_zadds(monitor, records) == []
    assert _leases(rc, records) == [None] * 6
    assert None not in rc.zmscore(keys.DEADLINES, records)

    proc = f"{unique('ql-host')}:4242"
    before = int(time.time() * 1000)
    with as_process(proc):
        popped = pop_more(rc, lane, keys.lane_queues(lane), 2)  # a prefork worker's pop: nothing claimed
    assert [p.record for p in popped] == records[:2] and not any(p.owner for p in popped)
    for score in _leases(rc, records[:2]):
        assert before + QUEUED_MS <= score <= int(time.time() * 1000) + QUEUED_MS
    assert _leases(rc, records[2:]) == [None] * 4

    # A pop that claims one and takes another unclaimed: both leases in the claim's one ZADD.
    with Monitor(rc) as monitor, as_process(proc):
        popped = pop_more(rc, lane, keys.lane_queues(lane), 2, claims=PopClaims(1, {HANDLER}, f"{proc}:p1."))
    assert [p.owner != "" for p in popped] == [True, False]
    claim, queued = _leases(rc, records[2:4])
    assert claim <= int(time.time() * 1000) + settings.DISPATCH_LEASE_S * 1000 < queued
    zadds = _lease_zadds(monitor, records[2:4])
    assert len(zadds) == 1 and all(r in zadds[0] for r in records[2:4]), zadds
    rc.delete(keys.process_in_hand(proc), keys.process_held(proc))


def test_a_message_lost_after_its_pop_is_republished_a_queued_lease_after_that_pop(rc):
    """The pop's reply was lost (the process lives on, its in-hand set naming the record): the sweep republishes
    it once the lease its pop wrote runs out, onto the empty list, whatever time it waited before its pop."""
    type_name, lane = unique("ql-lost"), unique("l-ql-lost")
    define(type_name, lane=lane)
    result = dispatch.delay(type_name, {"n": 1})
    record = keys.task_record(result.task_id)
    proc = f"{unique('ql-lost-host')}:4242"
    with as_process(proc):
        assert [p.record for p in pop_more(rc, lane, keys.lane_queues(lane), 1)] == [record]  # its reply lost
    popped_at = int(time.time() * 1000)
    sweep(now_ms=popped_at + QUEUED_MS - 1000, batch=10_000, queued_lease_ms=QUEUED_MS)
    assert rc.hget(record, "pub") == b"1" and sum(rc.llen(q) for q in keys.lane_queues(lane)) == 0
    sweep(now_ms=popped_at + QUEUED_MS + 1000, batch=10_000, queued_lease_ms=QUEUED_MS)
    assert rc.hget(record, "pub") == b"2" and sum(rc.llen(q) for q in keys.lane_queues(lane)) == 1
    rc.delete(keys.process_in_hand(proc))


def test_a_copy_lost_from_an_empty_list_is_republished_by_the_audit_and_a_waiting_one_is_left_alone(rc):
    """No pop took it (a pop leases what it takes), so a published 'queued' record with no lease and an empty
    lane list lost its copy: the audit's walk of the waiting tasks republishes it at once. A copy waiting in
    its list (no lease either) is left alone."""
    type_name, lane = unique("ql-gone"), unique("l-ql-gone")
    other_type, other_lane = unique("ql-wait"), unique("l-ql-wait")
    define(type_name, lane=lane)
    define(other_type, lane=other_lane)
    gone = [dispatch.delay(type_name, {"n": i}) for i in range(2)]
    waiting = dispatch.delay(other_type, {"n": 1})
    gone_records = [keys.task_record(r.task_id) for r in gone]
    for queue in keys.lane_queues(lane):
        rc.delete(queue)  # the copies vanish (data lost); their records stay, waiting
    _audit_every_waiting_task(rc, int(time.time() * 1000))
    copies = [m for q in keys.lane_queues(lane) for m in rc.lrange(q, 0, -1)]
    assert sorted(copies) == sorted(f"{r}#2".encode() for r in gone_records), copies
    assert [rc.hget(r, "st") for r in gone_records] == [b"queued", b"queued"]
    assert None not in _leases(rc, gone_records)  # republished: under a queued lease, as publish_record leaves it
    repaired = int(rc.hget(keys.METRICS_TOTAL, f"chats_repaired|{lane}|lost_copy") or 0)
    assert repaired == 2
    assert rc.hget(keys.task_record(waiting.task_id), "pub") == b"1"
    assert sum(rc.llen(q) for q in keys.lane_queues(other_lane)) == 1
    assert not rc.hget(keys.METRICS_TOTAL, f"chats_repaired|{other_lane}|lost_copy")


def test_a_chat_head_waiting_in_its_list_without_a_lease_is_not_republished(rc):
    """A published chat head has no lease while its copy waits (admission writes none): the chat audit leaves it
    alone (before, a head without a lease was republished as 'no_lease')."""
    type_name, lane = unique("ql-chat"), unique("l-ql-chat")
    define(type_name, lane=lane, chat_scoped=True)
    chat = unique("chat")
    sent = [dispatch.delay(type_name, {"n": i}, chat_id=chat) for i in range(2)]
    head = keys.task_record(sent[0].task_id, chat)
    assert rc.zscore(keys.LEASES, head) is None
    _audit_every_waiting_task(rc, int(time.time() * 1000))
    assert rc.hget(head, "pub") == b"1" and sum(rc.llen(q) for q in keys.lane_queues(lane)) == 1
    assert not rc.hget(keys.METRICS_TOTAL, f"chats_repaired|{lane}|no_lease")
