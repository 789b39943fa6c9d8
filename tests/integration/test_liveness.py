"""Issue 17: recovery from dead worker processes costs what they held, never the backlog.

The scripts run against the session's real redis-server; the backlog is written
in the platform's own shapes (records, lane list entries, expired leases) with
pipelined commands, so tens of thousands of tasks take a second to set up.
The kill scenarios with real workers are in tests/faults/test_liveness.py.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from lanes import keys, leases
from lanes.lua.reclaim import reclaim
from lanes.lua.sweep import sweep
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique

BACKLOG = 40_000
BATCH = 500


@pytest.fixture
def backlog(rc):
    """A lane with ``BACKLOG`` queued tasks waiting in its list, every one past its queued lease."""
    name, lane = unique("lv-back"), unique("l-lv-back")
    define(name, lane=lane)
    first = dispatch.delay(name, {"n": 0})
    assert first.accepted
    template = {k.decode(): v for k, v in rc.hgetall(keys.task_record(first.task_id)).items()}
    queue = template["q"].decode()
    message = rc.lindex(queue, 0)
    prefix = unique("lvb")
    records = [keys.task_record(f"{prefix}-{i}") for i in range(BACKLOG)]
    expired = int((time.time() - 1) * 1000)
    pipe = rc.pipeline(transaction=False)
    for n, record in enumerate(records, 1):
        pipe.hset(record, mapping={**template, "pub": 1})
        pipe.lpush(queue, message)
        pipe.zadd(keys.LEASES, {record: expired})
        if n % 2000 == 0:
            pipe.execute()
    pipe.zadd(keys.LEASES, {keys.task_record(first.task_id): expired})
    pipe.execute()
    records.append(keys.task_record(first.task_id))
    yield lane, queue, template, records
    pipe = rc.pipeline(transaction=False)
    for i in range(0, len(records), 1000):
        pipe.delete(*records[i:i + 1000])
        pipe.zrem(keys.LEASES, *records[i:i + 1000])
    pipe.delete(*keys.lane_queues(lane))
    pipe.execute()


def _dead_process(rc, proc: str, *, running: list[str] = (), in_hand: list[str] = (), template: dict) -> None:
    """A process that claimed ``running`` and popped ``in_hand``, whose liveness is gone."""
    pipe = rc.pipeline(transaction=False)
    for record in running:
        pipe.hset(record, mapping={**template, "st": "running", "own": f"{proc}:140000", "pub": 1})
        pipe.zadd(keys.LEASES, {record: int((time.time() + 600) * 1000)})  # its lease is far from over
        pipe.sadd(keys.process_held(proc), record)
    for record in in_hand:
        pipe.hset(record, mapping={**template, "pub": 1})  # popped: in no list
        pipe.zadd(keys.LEASES, {record: int((time.time() + 600) * 1000)})
        pipe.sadd(keys.process_in_hand(proc), record)
    pipe.zadd(keys.PROCS, {proc: int((time.time() - 1) * 1000)})
    pipe.execute()


def test_a_backlog_past_every_lease_costs_the_sweeps_only_what_dead_workers_held(rc, backlog):
    _lane, queue, template, records = backlog
    depth = rc.llen(queue)
    assert depth == BACKLOG + 1
    # Processes earlier tests killed (same Redis) are reclaimed first, so the counts below are ours.
    reclaim(now_ms=int(time.time() * 1000), max_processes=1000, queued_lease_ms=60_000)
    host = unique("gone-host")
    child, main = f"{host}:101", f"{host}:100"
    claimed = [keys.task_record(unique("lv-run")) for _ in range(3)]
    popped = [keys.task_record(unique("lv-pop")) for _ in range(2)]
    _dead_process(rc, child, running=claimed, template=template)
    _dead_process(rc, main, in_hand=popped, template=template)
    try:
        done = reclaim(now_ms=int(time.time() * 1000), max_processes=20, queued_lease_ms=60_000)
        # Exactly what the two dead processes held was looked at, and handed on: the
        # 40,000 waiting tasks were not read.
        assert (done.processes, done.examined, done.republished) == (2, 5, 5)
        assert done.commands <= 10 * done.examined + 10
        assert rc.llen(queue) == depth + 5
        assert {rc.hget(r, "st") for r in claimed + popped} == {b"queued"}
        assert not rc.exists(keys.process_held(child), keys.process_in_hand(main))
        assert rc.zscore(keys.PROCS, child) is None and rc.zscore(keys.PROCS, main) is None
        again = reclaim(now_ms=int(time.time() * 1000), max_processes=20, queued_lease_ms=60_000)
        assert (again.examined, again.commands) == (0, 1)

        # The lease sweep: each waiting task's expired lease is looked at once (O(1), no
        # search) and parked; no copy is made of any of them.
        now_ms = int(time.time() * 1000)
        while True:
            swept = sweep(now_ms=now_ms, batch=BATCH, queued_lease_ms=60_000)
            assert swept.commands <= 4 * BATCH + 1 + 8 * swept.republished
            if swept.parked + swept.republished + swept.forgotten < BATCH:
                break
        assert rc.llen(queue) == depth + 5  # no copy of a waiting task
        assert _parked(rc, records) == len(records)
        # Ten queued leases later the backlog still waits and costs the sweep nothing: only
        # leases not parked (the five handed on above, anything else in Redis) are looked at.
        later_ms = now_ms + 10 * 60_000
        due = rc.zcount(keys.LEASES, "-inf", later_ms)
        later = sweep(now_ms=later_ms, batch=BATCH, queued_lease_ms=60_000)
        assert later.parked + later.republished + later.forgotten == min(due, BATCH) >= 5
        assert later.commands <= 1 + 4 * min(due, BATCH) + 8 * later.republished
        assert _parked(rc, records) == len(records)
        assert rc.llen(queue) == depth + 5
    finally:
        rc.delete(*claimed, *popped)
        rc.zrem(keys.LEASES, *claimed, *popped)


def _parked(rc, records: list[str]) -> int:
    scores = []
    for i in range(0, len(records), 5000):
        scores += rc.zmscore(keys.LEASES, records[i:i + 5000])
    return sum(1 for score in scores if score == float("inf"))


def test_a_claim_names_its_process_and_registers_its_liveness(rc):
    from lanes.lua.start import start

    name, lane = unique("lv-claim"), unique("l-lv-claim")
    define(name, lane=lane)
    result = dispatch.delay(name, {"n": 1})
    record = keys.task_record(result.task_id)
    proc = f"{unique('claim-host')}:4242"
    reply = start(task_id=result.task_id, record=record, chat="", attempt=1, owner=f"{proc}:1", now=time.time(),
                  lease_ms=30_000, max_deliveries=5, dead_owner="", metric_field=f"{lane}|{name}",
                  queue_latency_bucket="", queue_latency_s=0.0, process=proc, liveness_ms=5000)
    assert reply.status == "run"
    assert rc.smembers(keys.process_held(proc)) == {record.encode()}
    assert rc.zscore(keys.PROCS, proc) > time.time() * 1000
    # Once its liveness is gone the claim is handed on, long before its 30 s lease.
    rc.zadd(keys.PROCS, {proc: 0})
    done = reclaim(now_ms=int(time.time() * 1000), max_processes=20, queued_lease_ms=60_000)
    assert done.processes >= 1 and done.republished >= 1
    assert rc.hget(record, "st") == b"queued"
    rc.delete(*keys.lane_queues(lane))


def test_a_stopped_process_is_vouched_for_and_only_its_in_hand_messages_are_handed_on(rc):
    """SIGSTOP: a process that may wake and finish its effect keeps its claims until their lease."""
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        proc = leases.process_id(sleeper.pid)
        late = [(proc, (time.time() + 1) * 1000)]
        now_ms = int(time.time() * 1000)
        os_stop(sleeper.pid)
        dead, vouched = leases.judge_peers(late, now_ms, leases.process_id())
        assert (dead, vouched) == ([], [proc])
        assert leases.judge_peers([(proc, (time.time() + 60) * 1000)], now_ms, leases.process_id()) == ([], [])
        assert leases.judge_peers([("other-host:" + str(sleeper.pid), 1.0)], now_ms, leases.process_id()) == ([], [])

        name, lane = unique("lv-stop"), unique("l-lv-stop")
        define(name, lane=lane)
        template = {k.decode(): v for k, v in rc.hgetall(
            keys.task_record(dispatch.delay(name, {"n": 0}).task_id)).items()}
        claimed, popped = keys.task_record(unique("lv-srun")), keys.task_record(unique("lv-spop"))
        _dead_process(rc, proc, running=[claimed], in_hand=[popped], template=template)
        rc.zadd(keys.PROCS_VOUCHED, {proc: int((time.time() + 5) * 1000)})
        done = reclaim(now_ms=int(time.time() * 1000), max_processes=20, queued_lease_ms=60_000)
        assert (done.processes, done.republished) == (0, 1)
        assert rc.hget(claimed, "st") == b"running" and rc.hget(popped, "st") == b"queued"
        assert rc.zscore(keys.PROCS, proc) > time.time() * 1000  # looked at again when the vouch ends

        sleeper.kill()  # killed, not yet reaped: a zombie is dead
        time.sleep(0.2)
        assert leases.judge_peers(late, now_ms, leases.process_id()) == ([proc], [])
        sleeper.wait()
        assert leases.judge_peers(late, now_ms, leases.process_id()) == ([proc], [])
        rc.delete(claimed, popped, keys.process_held(proc), *keys.lane_queues(lane))
        rc.zrem(keys.PROCS, proc)
        rc.zrem(keys.PROCS_VOUCHED, proc)
        rc.zrem(keys.LEASES, claimed, popped)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def os_stop(pid: int) -> None:
    import os

    os.kill(pid, signal.SIGSTOP)


def test_a_child_forked_while_a_thread_uses_the_pool_gets_a_client_of_its_own(rc):
    """Defect (L2): a pool child forked while the parent's lease thread held the Redis pool's
    lock hung in its first claim (redis-py resets an inherited pool under that lock)."""
    import os
    import threading

    from lanes.redis_client import get_redis

    pool = get_redis().connection_pool
    get_redis().ping()
    held, release = threading.Event(), threading.Event()

    def hold_pool_lock() -> None:
        with pool._lock:
            held.set()
            release.wait(10)

    threading.Thread(target=hold_pool_lock, daemon=True).start()
    assert held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: a fresh client answers at once
        code = 1
        try:
            get_redis().ping()
            code = 0
        finally:
            os._exit(code)
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child hung on the Redis pool's inherited lock")
    finally:
        release.set()
