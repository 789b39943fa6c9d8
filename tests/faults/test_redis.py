"""Scenarios 3 and 4: Redis killed and restarted from its AOF; Redis paused (SIGSTOP) and resumed."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time

import pytest

from lanes import keys
from tests.faults.harness import LONG, drain_and_check, long_only, pick
from tests.support.helpers import unique

REDIS_TIMEOUT_S = 3.0  # DISPATCH_REDIS_TIMEOUT_S for these scenarios (default 5)


def _latency(load) -> dict:
    """Dispatch latency (ms) of the calls answered at once (no outage in the way)."""
    took = sorted(e["last_s"] * 1000 for e in load.entries() if e["calls"] == 1 and e["accepted"])
    if not took:
        return {}
    return {"n": len(took), "p50_ms": round(statistics.median(took), 2),
            "p99_ms": round(took[min(len(took) - 1, int(len(took) * 0.99))], 2)}


class AofSampler:
    """Samples the AOF file's size, to cut it back to what an fsync a moment ago had made durable."""

    def __init__(self, path) -> None:
        self.path = path
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            try:
                self.samples.append((time.time(), os.path.getsize(self.path)))
            except FileNotFoundError:
                pass

    def size_at(self, when: float) -> int:
        self.stop.set()
        self.thread.join()
        self.cut = (max(size for t, size in self.samples if t <= when), self.samples[-1][1])
        return self.cut[0]


def _kill_restart_phase(cluster, name, lane, *, fsync: str, power_cut_s: float = 0.0) -> tuple:
    """Load; SIGKILL redis-server a third of the way in; restart it from its AOF 2 s later."""
    client = cluster.client()
    client.config_set("appendfsync", fsync)
    cluster.redis.appendfsync = fsync  # and after the restart
    aof = cluster.redis.data_dir / "appendonly.aof"
    duration = pick(9, 30)
    load = cluster.constant_load(name, rate=pick(25, 40), duration=duration, chats=pick(24, 48))
    sampler = AofSampler(aof) if power_cut_s else None
    time.sleep(duration / 3)
    killed_at = time.time()
    cluster.redis_kill()
    if sampler:
        # A power cut at killed_at keeps what the last fsync wrote: with everysec, the AOF as it was
        # up to ~1 s earlier (2 s when the disk lags). Cut the file back to that size.
        os.truncate(aof, sampler.size_at(killed_at - power_cut_s))
    time.sleep(2.0)
    cluster.redis_restart()
    load.wait(timeout=duration + 120)
    if sampler:
        load.aof_cut_bytes = sampler.cut[1] - sampler.cut[0]
    return load, killed_at


def test_03_sigkill_redis_and_restart_from_the_aof(cluster_factory, record):
    """(a) appendfsync always (the embedded Redis's default): SIGKILL loses nothing.
    (b) everysec: SIGKILL of Redis alone loses nothing either (the kernel has the writes).
    (c) everysec and a power cut (simulated): what the last second wrote is lost; measured."""
    started = time.time()
    cluster = cluster_factory(env={"DISPATCH_REDIS_TIMEOUT_S": str(REDIS_TIMEOUT_S)})
    lane = unique("fl-aof")
    name = cluster.http_type(lane)
    cluster.sink.sink.behaviour.delay_s = (0.005, 0.03)
    workers = cluster.workers_at_once(lane, [{"concurrency": 2}, {"pool": "threads", "concurrency": 4}])
    pids = [w.pid for w in workers]

    load, _ = _kill_restart_phase(cluster, name, lane, fsync="always")
    rep = drain_and_check(cluster, [load], scenario="3a kill Redis, fsync always", drain_bound=pick(60, 90),
                          lanes=[lane])
    rep.extra["dispatch_latency_always"] = _latency(load)
    record("03a-redis-kill-always", rep, started)
    assert rep.accepted > 0 and rep.accounted, rep.summary()

    if LONG:  # (b) differs from (a) only in when the kernel writes: the long campaign's (suite time)
        started = time.time()
        load, _ = _kill_restart_phase(cluster, name, lane, fsync="everysec")
        rep = drain_and_check(cluster, [load], scenario="3b kill Redis, fsync everysec", drain_bound=pick(60, 90),
                              lanes=[lane])
        rep.extra["dispatch_latency_everysec"] = _latency(load)
        record("03b-redis-kill-everysec", rep, started)
        assert rep.accepted > 0 and rep.accounted, rep.summary()

    if not LONG:  # (c) measures the power-cut window: the long campaign's (suite time)
        return
    started = time.time()
    window = 1.0
    # Slower sends (0.5 s): the workers fall behind, so the last second's dispatches are still
    # waiting when the power goes (a task already applied cannot be lost).
    cluster.sink.sink.behaviour.delay_s = (0.5, 0.5)
    load, killed_at = _kill_restart_phase(cluster, name, lane, fsync="everysec", power_cut_s=window)
    rep = drain_and_check(cluster, [load], scenario="3c power cut, fsync everysec", drain_bound=pick(60, 90),
                          lanes=[lane])
    lost_keys = set(rep.lost_keys)
    by_key = {e["key"]: e for e in load.entries()}
    lost_at = [by_key[k]["done"] - killed_at for k in lost_keys if k in by_key]
    accepted_in_window = sum(1 for e in by_key.values()
                             if e["accepted"] and killed_at - window <= e["done"] <= killed_at)
    rep.extra["power_cut"] = {"window_s": window, "aof_bytes_cut": load.aof_cut_bytes, "lost": rep.lost,
                              "accepted_in_window": accepted_in_window,
                              "lost_accepted_s_before_kill": sorted(round(-x, 2) for x in lost_at)}
    record("03c-power-cut-everysec", rep, started)
    # What is lost is what was accepted inside the window, never older; the rest is accounted for.
    assert rep.lost <= accepted_in_window + 2, rep.summary()
    assert all(-window - 0.5 <= x <= 0.2 for x in lost_at), rep.summary()
    assert rep.accepted == rep.succeeded + rep.dead + rep.lost
    assert rep.unexpected == rep.duplicate_effects == rep.order_violations == rep.stuck == 0, rep.summary()
    assert [w.pid for w in workers] == pids and all(w.alive() for w in workers)  # they reconnected by themselves


def test_04_sigstop_redis_then_sigcont(cluster_factory, record):
    """Redis frozen under load (10 s here, 20 s in ``make faults``; either is several of dispatch's
    timeouts): dispatch answers ``unavailable`` within its timeout (saying
    when the outcome is unknown), never half-writes; workers reconnect by themselves; all drains."""
    started = time.time()
    cluster = cluster_factory(env={"DISPATCH_REDIS_TIMEOUT_S": str(REDIS_TIMEOUT_S)})
    lane = unique("fl-stop")
    name = cluster.http_type(lane)
    cluster.sink.sink.behaviour.delay_s = (0.005, 0.03)
    workers = cluster.workers_at_once(lane, [{"concurrency": 2}, {"pool": "threads", "concurrency": 4}])
    pids = [w.pid for w in workers]
    pause = pick(10.0, 20.0)
    before, after = pick(4, 15), pick(6, 15)
    duration = before + pause + after
    careful = cluster.constant_load(name, rate=pick(20, 30), duration=duration, chats=pick(24, 48))
    # Callers that do not retry: each answer must be the truth (accepted, or nothing written,
    # or "outcome unknown").
    one_shot = cluster.constant_load(name, rate=5, duration=duration, chats=8, retry_for=0)
    time.sleep(before)
    cluster.redis_pause()
    time.sleep(pause)
    cluster.redis_resume()
    careful.wait(timeout=duration + 120)
    one_shot.wait(timeout=duration + 120)
    rep = drain_and_check(cluster, [careful, one_shot], scenario=f"4 SIGSTOP Redis {pause:g} s",
                          drain_bound=pick(60, 90), lanes=[lane])
    entries = careful.entries() + one_shot.entries()
    slowest = max(e["slowest_s"] for e in entries)
    refused = [e for e in entries if e["first"] == "unavailable"]
    unknown = [e for e in entries if e["unknown_seen"]]
    gave_up = [e for e in one_shot.entries() if e["accepted"] is None]
    applied = cluster.sink.sink.applied
    rep.extra["dispatch"] = {"timeout_s": REDIS_TIMEOUT_S, "slowest_call_s": slowest,
                             "calls_answered_unavailable": len(refused), "said_outcome_unknown": len(unknown),
                             "one_shot_unknown": len(gave_up),
                             "one_shot_unknown_but_stored": sum(1 for e in gave_up if e["key"] in applied)}
    record("04-redis-sigstop", rep, started)
    assert refused, "no dispatch met the frozen Redis"
    assert slowest <= 2 * REDIS_TIMEOUT_S + 1.0, rep.summary()
    assert rep.accepted > 0 and rep.accounted and rep.concurrent_same_key == 0, rep.summary()
    assert [w.pid for w in workers] == pids and all(w.alive() for w in workers)


@long_only("scenario 4 (SIGSTOP Redis) runs here")
def test_04b_a_frozen_redis_leaves_no_stale_restore_lock(cluster_factory):
    """Defect behind scenario 4's intermittent stuck chat: a worker's scan for unacknowledged
    messages met the frozen Redis, its lock request (SET NX, 300 s in stock kombu) timed out in the
    worker but ran when Redis resumed, so the lock stayed held by no one. Meanwhile a message whose
    ack had met the frozen Redis stayed in the unacked hash, its chat blocked for up to 5 minutes.
    Here: freeze Redis longer than the broker's socket timeout, then leave an orphaned unacked
    message; a worker must hand it back to its lane within the bound."""
    cluster = cluster_factory(env={"DISPATCH_REDIS_TIMEOUT_S": "1", "DISPATCH_BROKER_TIMEOUT_S": "2"})
    lane, orphan_lane = unique("fl-lock"), unique("fl-orphan")
    cluster.http_type(lane)
    cluster.worker(lane, concurrency=1)
    time.sleep(1.0)
    cluster.redis_pause()
    time.sleep(5.0)  # > the broker socket timeout: a scan's lock request times out
    cluster.redis_resume()
    time.sleep(1.0)
    c = cluster.client()
    tag = unique("orphan-tag")
    message = {"body": "", "content-encoding": "utf-8", "content-type": "application/json", "headers": {},
               "properties": {"delivery_tag": tag, "priority": 0, "body_encoding": "base64",
                              "delivery_info": {"exchange": "", "routing_key": orphan_lane}}}
    # Taken by a worker whose ack was lost, longer ago than the visibility timeout.
    c.zadd("unacked_index", {tag: time.time() - 3600})
    c.hset("unacked", tag, json.dumps([message, "", orphan_lane]))
    deadline = time.time() + 20
    while c.hexists("unacked", tag) and time.time() < deadline:
        time.sleep(0.5)
    lock_ttl = c.ttl("unacked_mutex")
    assert not c.hexists("unacked", tag), f"the orphan stayed unacked; kombu's restore lock TTL is {lock_ttl} s"
    assert sum(c.llen(q) for q in keys.lane_queues(orphan_lane)) == 1



def test_04c_an_ack_lost_to_redis_frees_its_prefetch_slot(cluster_factory):
    """Defect: kombu freed a message's prefetch slot only once its ack reached Redis. An ack that
    failed (Redis gone or frozen past redis-py's retries) kept the slot forever, so a worker that
    lost as many acks as its prefetch count stopped consuming, its log saying only "Couldn't ack".
    The platform's transport frees the slot; the message stays unacked in Redis and comes back
    after the visibility timeout (its redelivery is refused or re-stored by the claim)."""
    from kombu import Connection, Exchange, Queue

    cluster = cluster_factory()
    name = unique("fl-ack")
    options = {"socket_timeout": 1, "socket_connect_timeout": 1, "visibility_timeout": 60}
    with Connection(cluster.redis.url, transport="lanes.transport:Transport", transport_options=options) as conn:
        channel = conn.channel()
        queue = Queue(name, Exchange(name, type="direct"), routing_key=name, channel=channel)
        queue.declare()
        conn.Producer(channel=channel).publish({"n": 1}, exchange=queue.exchange, routing_key=name, serializer="json")
        channel.basic_qos(0, 1, False)
        message = queue.get(no_ack=False)
        assert message is not None and not channel.qos.can_consume()  # the one slot is taken
        cluster.redis_kill()
        with pytest.raises(conn.connection_errors):
            message.ack()
        assert channel.qos.can_consume(), "a lost ack kept its prefetch slot: this consumer would never consume again"
    cluster.redis_restart()
    assert cluster.client().hlen("unacked") == 1  # kept for the restore after the visibility timeout


def test_04d_an_outcome_that_met_a_frozen_redis_is_recorded_once_redis_answers(cluster_factory, record):
    """Defect: when Redis froze just after a handler's effect, ``finish.lua`` timed out and Celery
    stored FAILURE for a task that had succeeded; the script had still run when Redis resumed, so
    nothing ever corrected the row (``get()`` raised TimeoutError). Now the worker keeps its lease
    and sends the call again until Redis answers: every accepted task ends SUCCESS, applied once."""
    from django_celery_results.models import TaskResult

    started = time.time()
    cluster = cluster_factory(env={"DISPATCH_REDIS_TIMEOUT_S": "1", "DISPATCH_BROKER_TIMEOUT_S": "2"})
    lane = unique("fl-outcome")
    name = cluster.http_type(lane)
    cluster.sink.sink.behaviour.delay_s = (0.8, 1.2)  # handlers are mid-effect when Redis freezes
    workers = cluster.workers_at_once(lane, [{"concurrency": 2}, {"pool": "threads", "concurrency": 2}])
    load = cluster.constant_load(name, rate=4, duration=8, chats=4)  # the freeze ends at 7.5 s
    time.sleep(3.5)
    cluster.redis_pause()
    time.sleep(4.0)
    cluster.redis_resume()
    load.wait(timeout=60)
    rep = drain_and_check(cluster, [load], scenario="4d outcome vs frozen Redis", drain_bound=45, lanes=[lane])
    record("04d-redis-sigstop-outcome", rep, started)
    assert rep.accepted > 0 and rep.accounted and rep.concurrent_same_key == 0, rep.summary()
    met = sum(w.log_text().count("TimeoutError") for w in workers)
    assert met > 0, "no worker call met the frozen Redis: the scenario did not test anything"
    ids = [op.task_id for op in load.ops() if op.accepted]
    deadline = time.time() + 20
    while time.time() < deadline:
        statuses = dict(TaskResult.objects.filter(task_id__in=ids).values_list("task_id", "status"))
        if len(statuses) == len(ids) and set(statuses.values()) == {"SUCCESS"}:
            break
        time.sleep(0.5)
    wrong = {i: statuses.get(i) for i in ids if statuses.get(i) != "SUCCESS"}
    assert not wrong, f"{len(wrong)} accepted tasks not stored as SUCCESS: {list(wrong.items())[:5]}"
