"""The claim at the pop (``pop_more.lua``): a grouping worker's pop claims the plain messages its idle run threads
will run, so that no claim call follows it; every other message is popped as before. Counted, never timed."""

from __future__ import annotations

import time
from contextlib import contextmanager
from unittest import mock

from django.conf import settings
from django_celery_results.models import TaskResult

from lanes import keys, leases
from lanes.lua.loader import script
from lanes.lua.pop_more import PopClaims, pop_more
from lanes.lua.reclaim import reclaim
from tasks.dispatch import dispatch
from tests.integration.test_doorbells import Monitor
from tests.support.helpers import define, unique, wait_until

HANDLER = "demo.echo"


@contextmanager
def as_process(proc: str):
    """pop_more names and claims for the calling process: here, a modelled worker's."""
    with mock.patch.object(leases, "process_id", lambda pid=None: proc), \
            mock.patch.object(leases.current(), "registered", lambda: True):
        yield


def _waiting(rc, lane: str) -> int:
    return int(rc.get(keys.lane_waiting(lane)) or 0)


def test_a_message_claimed_at_the_pop_and_never_run_is_reclaimed_within_a_lease(rc):
    type_name, lane = unique("cap"), unique("l-cap")
    define(type_name, lane=lane)
    result = dispatch.delay(type_name, {"n": 1})
    record = keys.task_record(result.task_id)
    proc = f"{unique('cap-host')}:4242"
    assert _waiting(rc, lane) == 1
    with as_process(proc):
        [popped] = pop_more(rc, lane, keys.lane_queues(lane), 4,
                            claims=PopClaims(4, {HANDLER}, f"{proc}:p1."))
    # Claimed as start.lua claims: running under its owner, out of the deadlines set and the waiting count,
    # under the claim's lease, named in the process's held set (not its in-hand set).
    assert popped.owner == f"{proc}:p1.1" and popped.config_version != ""
    assert rc.hmget(record, "st", "own", "dlv") == [b"running", popped.owner.encode(), b"1"]
    assert rc.zscore(keys.DEADLINES, record) is None and _waiting(rc, lane) == 0
    assert rc.zscore(keys.LEASES, record) > (time.time() + settings.DISPATCH_LEASE_S / 2) * 1000
    assert rc.smembers(keys.process_held(proc)) == {record.encode()}
    assert not rc.exists(keys.process_in_hand(proc))
    # The process dies before a thread ran it: handed on at once, long before the claim's lease.
    rc.zadd(keys.PROCS, {proc: 0})
    done = reclaim(now_ms=int(time.time() * 1000), max_processes=20, queued_lease_ms=60_000)
    assert done.processes >= 1 and done.republished >= 1
    assert rc.hget(record, "st") == b"queued" and rc.zscore(keys.DEADLINES, record) is not None
    assert _waiting(rc, lane) == 1
    # Its new copy is claimed again by the next pop (a second delivery).
    other = f"{unique('cap-host')}:4343"
    with as_process(other):
        [again] = pop_more(rc, lane, keys.lane_queues(lane), 4, claims=PopClaims(4, {HANDLER}, f"{other}:p1."))
    assert again.owner == f"{other}:p1.1" and rc.hget(record, "dlv") == b"2"
    rc.zadd(keys.PROCS, {other: 0})
    reclaim(now_ms=int(time.time() * 1000), max_processes=20, queued_lease_ms=60_000)
    rc.delete(*keys.lane_queues(lane))


def test_the_pop_claims_only_what_its_run_threads_will_run(rc):
    type_name, other_type, chat_type = unique("cap"), unique("cap-o"), unique("cap-c")
    lane = unique("l-cap")
    define(type_name, lane=lane)
    define(other_type, lane=lane, handler="demo.flaky")  # a handler the pop was not told of
    define(chat_type, lane=lane, chat_scoped=True)
    chat = unique("c")
    plain = [dispatch.delay(type_name, {"n": n}) for n in range(3)]
    other = dispatch.delay(other_type, {})
    head, behind = (dispatch.delay(chat_type, {"n": n}, chat_id=chat) for n in range(2))
    assert all(r.accepted for r in (*plain, other, head, behind))
    # The second of the chat is not published until the head ends: hand it to the lane as a stale copy would be.
    behind_record = keys.task_record(behind.task_id, chat)
    rc.lpush(keys.lane_queues(lane)[0], f"{behind_record}#{int(rc.hget(behind_record, 'pub') or 0)}")
    proc = f"{unique('cap-host')}:4444"
    with as_process(proc):
        popped = pop_more(rc, lane, keys.lane_queues(lane), 10, claims=PopClaims(3, {HANDLER}, f"{proc}:p7."))
    by_id = {p.record.rsplit(":", 1)[1]: p for p in popped}
    assert set(by_id) == {*(r.task_id for r in plain), other.task_id, head.task_id, behind.task_id}
    claimed = {task_id for task_id, p in by_id.items() if p.owner}
    # At most its room (3); never another handler's message, nor one behind its chat's head.
    assert len(claimed) == 3 and other.task_id not in claimed and behind.task_id not in claimed
    in_hand = {m.decode() for m in rc.smembers(keys.process_in_hand(proc))}
    held = {m.decode() for m in rc.smembers(keys.process_held(proc))}
    assert held == {by_id[t].record for t in claimed}
    assert in_hand == {p.record for p in popped} - held
    for task_id, p in by_id.items():
        assert rc.hget(p.record, "st") == (b"running" if task_id in claimed else b"queued"), task_id
    # Nothing claimed: the pop is the one it was.
    nobody = f"{unique('cap-host')}:4545"
    late = dispatch.delay(type_name, {"n": 9})
    with as_process(nobody):
        [unclaimed] = pop_more(rc, lane, keys.lane_queues(lane), 10)
    assert unclaimed.owner == "" and unclaimed.config_version == ""
    assert rc.hget(keys.task_record(late.task_id), "st") == b"queued"
    for p in (nobody, proc):
        rc.zadd(keys.PROCS, {p: 0})
    reclaim(now_ms=int(time.time() * 1000), max_processes=20, queued_lease_ms=60_000)
    rc.delete(*keys.lane_queues(lane))


def test_in_flow_a_thread_worker_makes_no_claim_call(rc, start_worker):
    """Tasks sent one at a time to an idle thread worker (the benchmark's shape): each is claimed by the pop
    that takes it, so Redis sees no claim call (claim_group.lua, start.lua) from the worker (before: one a task)."""
    type_name, lane = unique("cap-flow"), unique("l-cap-flow")
    define(type_name, lane=lane)
    start_worker(lane, pool="threads", concurrency=8)
    for r in [dispatch.delay(type_name, {"warm": i}) for i in range(5)]:
        r.get(timeout=60)
    claims = {script("claim_group").sha, script("start").sha}
    pops = script("pop_more").sha
    n = 60
    with Monitor(rc) as monitor:
        ids = []
        for i in range(n):
            result = dispatch.delay(type_name, {"i": i})
            assert result.accepted, result
            ids.append(result.task_id)
            result.get(timeout=60)
        wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == n, timeout=60,
                   what=f"{n} results stored")
    scripts = [c["command"].split(" ")[1] for c in monitor.seen
               if c["client_type"] != "lua" and c["command"].split(" ", 1)[0].upper() == "EVALSHA"]
    claim_calls = sum(1 for sha in scripts if sha in claims)
    assert scripts.count(pops) >= n, "every task was popped by pop_more"
    assert claim_calls == 0, f"{claim_calls} claim calls for {n} tasks"
