"""Scenario 11: the Redis master SIGKILLed under dispatch load; Redis Sentinel promotes a replica.

Real processes only: a primary, two replicas and three Sentinels (tests/support/sentinel.py),
workers and load generators pointed at the Sentinels (``REDIS_URL=sentinel://...``).

(a) ``DISPATCH_REPLICA_ACKS=0``: replication is asynchronous, so what the primary had
    accepted but not yet sent to the promoted replica is lost. Measured: the lost
    tasks, and how many were accepted in the last second before the kill (the bound).
(b) ``DISPATCH_REPLICA_ACKS=1``: admission answers "accepted" only once a replica holds
    the write (``WAIT``), so nothing accepted is lost.
Both: no duplicate effects, chat order kept, workers and dispatchers reconnect by
themselves (dispatches after the failover are accepted and run), /metrics names
the new master and counts the failover. Also dispatch latency with 0 vs 1.
"""

from __future__ import annotations

import re
import secrets
import shutil
import statistics
import time

import pytest
import redis
from django.test import Client, override_settings

from tests.faults.harness import ARTIFACTS, LONG, FaultCluster, drain_and_check, pick
from tests.support.helpers import unique
from tests.support.sentinel import SentinelTopology


@pytest.fixture
def sentinel_cluster(tmp_root):
    """A fault cluster whose Redis is a Sentinel topology (its processes stopped by PID at the end)."""
    from tests.support.http_sink import SinkServer

    made: list[FaultCluster] = []
    sink = SinkServer().__enter__()

    def make(env: dict | None = None) -> FaultCluster:
        cluster = FaultCluster(tmp_root, sink, env=env)
        cluster.redis = SentinelTopology(cluster.dir / "redis", secrets.token_urlsafe(12), replicas=2)
        cluster.env.update(cluster.redis.env)
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.close()
        ARTIFACTS.mkdir(exist_ok=True)
        for log in cluster.redis.logs():
            if log.exists():
                shutil.copy(log, ARTIFACTS / f"{cluster.dir.name}-{log.parent.name}.log")
    sink.__exit__(None, None, None)


def _percentiles(samples_s: list[float]) -> dict:
    ms = sorted(s * 1000 for s in samples_s)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3)}


def _dispatch_latency(cluster: FaultCluster, type_name: str, calls: int) -> dict:
    """p50/p99 of ``dispatch.delay`` in this process with DISPATCH_REPLICA_ACKS 0 and 1, interleaved."""
    from tasks.dispatch import dispatch

    took: dict[int, list[float]] = {0: [], 1: []}
    for i in range(calls):
        acks = i % 2
        with override_settings(DISPATCH_REPLICA_ACKS=acks):
            started = time.perf_counter()
            result = dispatch.delay(type_name, {"n": i}, chat_id=f"lat-{i % 16}", idempotency_key=unique("lat"))
            took[acks].append(time.perf_counter() - started)
        assert result.accepted, result
    return {f"replica_acks_{acks}": _percentiles(samples) for acks, samples in took.items()}


def _scrape(topology: SentinelTopology) -> str:
    """/metrics as a Prometheus scrape reads it, from a site pointed at the Sentinels."""
    from django.conf import settings

    from lanes.redis_client import reset_redis

    with override_settings(REDIS_URL=topology.url, DISPATCH_SENTINEL_MASTER=topology.master_name):
        reset_redis()
        try:
            response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.DISPATCH_METRICS_TOKEN}")
        finally:
            reset_redis()
    assert response.status_code == 200, response.content[:300]
    return response.content.decode()


#: Seconds the replicas are held behind the primary (their link stalled) just before it is killed. On an idle
#: loopback they lag by less than a millisecond and a kill loses nothing; a replica on a slow link or a
#: busy machine lags like this, and what the primary accepted meanwhile is what a failover loses.
LAG_S = 0.8


def _failover_phase(cluster: FaultCluster, name: str, lane: str) -> tuple:
    topology: SentinelTopology = cluster.redis
    duration = pick(12, 40)
    # 20/s against at most 15/s done: at the kill ~20 wait ahead of what the replicas missed (1.3 s of work > LAG_S).
    load = cluster.constant_load(name, rate=pick(20, 40), duration=duration, chats=pick(24, 48))
    time.sleep(duration / 3)
    topology.stall_replication()
    lag_from = time.time()
    time.sleep(LAG_S)
    killed_at = time.time()
    old = topology.kill_master()
    new = topology.wait_failover(old)
    failed_over_at = time.time()
    # Under load the Sentinels may elect twice (two leaders in successive epochs, the later one
    # promoting the other, staler replica a second later): follow the master until it holds 4 s.
    switches, settled_at = [new], failed_over_at
    while time.time() - settled_at < 4.0:
        try:
            now_master = topology.master_address()
        except redis.RedisError:
            now_master = switches[-1]
        if now_master != switches[-1]:
            switches.append(now_master)
            settled_at = time.time()
        time.sleep(0.1)
    load.wait(timeout=duration + 120)
    load.lag_from, load.failed_over_at, load.switches = lag_from, failed_over_at, switches
    return load, killed_at, settled_at, old, switches[-1]


def _run(cluster: FaultCluster, acks: int, record, scenario_id: str, started: float):
    lane = unique(f"fl-sent{acks}")
    name = cluster.http_type(lane)
    # Slow sends (0.4 s, 6 slots, 15/s < the offered rate): the workers fall behind, so what the
    # replicas missed is still waiting when the master dies (a task already applied cannot be lost).
    cluster.sink.sink.behaviour.delay_s = (0.4, 0.4)
    workers = [cluster.worker(lane, concurrency=2), cluster.worker(lane, pool="threads", concurrency=4)]
    pids = [w.pid for w in workers]
    assert 'dispatch_redis_failovers_total 0.0' in _scrape(cluster.redis)
    load, killed_at, settled_at, old, new = _failover_phase(cluster, name, lane)
    rep = drain_and_check(cluster, [load], scenario=f"11{'ab'[acks]} Sentinel failover, DISPATCH_REPLICA_ACKS={acks}",
                          drain_bound=pick(60, 90), lanes=[lane])
    entries = load.entries()
    applied = cluster.sink.sink.applied
    after = [e for e in entries if e["t"] > settled_at]
    by_key = {e["key"]: e for e in entries}
    lost_at = sorted(round(killed_at - by_key[k]["done"], 3) for k in rep.lost_keys if k in by_key)
    rep.extra["failover"] = {
        "replica_acks": acks, "old_master": f"{old[0]}:{old[1]}", "new_master": f"{new[0]}:{new[1]}",
        "failover_s": round(load.failed_over_at - killed_at, 2), "lost": rep.lost,
        "masters_elected": len(load.switches), "settled_s_after_kill": round(settled_at - killed_at, 2),
        # Lost when the Sentinels elected twice: what the short-lived master accepted, too.
        "accepted_until_settled": sum(1 for e in entries
                                      if e["accepted"] and load.lag_from <= e["done"] <= settled_at),
        "replicas_lag_s": LAG_S,
        "accepted_while_replicas_lagged": sum(1 for e in entries
                                               if e["accepted"] and load.lag_from <= e["done"] <= killed_at),
        "lost_accepted_s_before_kill": lost_at,
        # When the tasks accepted during the lag were applied, in s after the kill (negative: before it).
        "lagged_applied_s_after_kill": sorted(
            round(min(a.at for a in cluster.sink.sink.attempts_for(e["key"])) - killed_at, 2)
            for e in entries if e["accepted"] and load.lag_from <= e["done"] <= killed_at
            and cluster.sink.sink.attempts_for(e["key"])),
        "dispatched_after_failover": len(after),
        "accepted_after_failover": sum(1 for e in after if e["accepted"]),
        "answered_unavailable": sum(1 for e in entries if e["first"] == "unavailable"),
    }
    scraped = _scrape(cluster.redis)
    record(scenario_id, rep, started)
    # The dashboard's data shows the failover.
    # (The Sentinels' epoch grows by one per election: 2 when a first vote split and was held again.)
    failovers = re.search(r"^dispatch_redis_failovers_total (\S+)$", scraped, re.M)
    assert f'address="{new[0]}:{new[1]}"' in scraped and failovers and float(failovers[1]) >= 1, scraped
    # Dispatchers and workers reconnected by themselves: dispatches after the failover were accepted and ran.
    assert after and all(e["accepted"] for e in after), rep.summary()
    assert all(e["key"] in applied for e in after), rep.summary()
    assert [w.pid for w in workers] == pids and all(w.alive() for w in workers)
    assert rep.unexpected == rep.duplicate_effects == rep.order_violations == rep.stuck == 0, rep.summary()
    assert rep.accepted > 0 and rep.accepted == rep.succeeded + rep.dead + rep.lost, rep.summary()
    return rep, name


@pytest.mark.skipif(not LONG, reason="long campaign only (make faults): what acks=0 loses grows with the "
                    "machine's load, so its bound is judged on a quiet run; 11b (acks=1 loses nothing) runs here")
def test_11a_failover_without_replica_acks_loses_at_most_the_last_moment(sentinel_cluster, record):
    started = time.time()
    cluster = sentinel_cluster({"DISPATCH_REPLICA_ACKS": "0"})
    rep, _ = _run(cluster, 0, record, "11a-sentinel-failover-acks0", started)
    # Lost: only what was accepted while the replicas lagged (not yet replicated), never older; if the
    # Sentinels elected twice, also what the short-lived master accepted until the second switch.
    info = rep.extra["failover"]
    if info["masters_elected"] == 1:
        assert rep.lost <= info["accepted_while_replicas_lagged"] + 2, rep.summary()
    assert rep.lost <= info["accepted_until_settled"] + 2, rep.summary()
    assert all(x <= LAG_S + 0.3 for x in info["lost_accepted_s_before_kill"] if x >= 0), rep.summary()


def test_11b_failover_with_replica_acks_loses_nothing(sentinel_cluster, record):
    started = time.time()
    cluster = sentinel_cluster({"DISPATCH_REPLICA_ACKS": "1"})
    rep, name = _run(cluster, 1, record, "11b-sentinel-failover-acks1", started)
    assert rep.lost == 0, rep.summary()
    # The price of the guarantee, measured side by side in one run against this topology.
    from lanes.redis_client import reset_redis
    from tasks import config

    try:
        with override_settings(REDIS_URL=cluster.redis.url, DISPATCH_SENTINEL_MASTER=cluster.redis.master_name):
            reset_redis()
            config.reload()
            latency = _dispatch_latency(cluster, name, pick(200, 2000))  # recorded, not asserted
    finally:
        # Back on the session's Redis once the settings are back: a client (or a config
        # loaded through one) made while they still pointed at the Sentinels would outlive
        # this test and fail every later one when the topology stops.
        reset_redis()
        config.reload()
    rep.extra["dispatch_latency"] = latency
    record("11c-replica-acks-latency", rep, started)
