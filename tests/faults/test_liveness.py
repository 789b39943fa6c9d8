"""Issue 17: worker liveness. Kill a worker's main process, a pool child, or a whole simulated
host under load: every chat moves again within ``BOUND_S``, measured on the checker's per-chat
timeline (a count of chats that waited longer), with production leases (30 s, queued 60 s), so
only liveness, never a lease running out, can meet the bound."""

from __future__ import annotations

import os
import signal
import threading
import time

from lanes import keys
from tests.faults.harness import FaultCluster, LoadRun, dead_letters, deliveries, drain_and_check, long_only, pick
from tests.support.helpers import unique, wait_until
from tools.loadcheck import chat_stalls

#: Every affected chat moves again within this many seconds of a kill.
BOUND_S = 10.0
#: The production leases: a recovery that waited for one would take 30 s or more.
PRODUCTION_LEASES = {"DISPATCH_LEASE_S": "30", "DISPATCH_QUEUED_LEASE_S": "60"}
#: Seconds of load in ``make test``: the kill lands while it runs (at a third or half of it, the
#: workers busy after their first second), and a held message counts as a stalled chat from its own
#: dispatch to its delivery until the drain ends, so a longer tail of load proves nothing more
#: (L2's killer still kills at 3 s and 6 s; 60 s in ``make faults``).
LOAD_S = 9


def _assert_moved(rep, stalled: int) -> None:
    """Every chat moved within ``BOUND_S``: none waits for a lease (a worker pops a lane's messages
    only in the script that names them in its in-hand set, so a kill never leaves one in no set:
    docs/liveness.md, doorbells)."""
    assert stalled == 0, rep.examples.get("stalled_chats")


def _check(cluster: FaultCluster, loads: list[LoadRun], *, scenario: str, scenario_id: str, lane: str, record,
           started: float, extra: dict):
    rep = drain_and_check(cluster, loads, scenario=scenario, drain_bound=pick(60, 120), lanes=[lane])
    ops = [op for load in loads for op in load.ops()]
    at = {k: t for load in loads for k, t in load.dispatched_at().items()}
    stalled, worst, examples = chat_stalls(
        ops, at, deliveries(cluster.sink.sink, [ld.spec["run"] for ld in loads]), bound=BOUND_S,
        until=time.time(), dead=dead_letters(cluster.types))
    rep.extra.update(extra)
    rep.extra["chats_stalled_past_bound"] = stalled
    rep.extra["longest_chat_wait_s"] = worst
    if examples:
        rep.examples["stalled_chats"] = examples
    record(scenario_id, rep, started)
    return rep, stalled


def _in_hand(cluster: FaultCluster, host: str, pid: int) -> int:
    return cluster.client().scard(keys.process_in_hand(f"{host}:{pid}"))


def test_l1_main_process_killed_holding_popped_messages(cluster_factory, record):
    """The main process holds prefetched messages no child has claimed; SIGKILL it."""
    started = time.time()
    cluster = cluster_factory(env=PRODUCTION_LEASES)
    lane = unique("fl-lv-main")
    name = cluster.http_type(lane)
    cluster.sink.sink.behaviour.delay_s = (0.15, 0.3)
    victim, _ = cluster.workers_at_once(lane, [{"concurrency": 1, "host": "hostA"},  # one slot, four prefetched
                                                {"concurrency": 2, "host": "hostB"}])
    duration = pick(LOAD_S, 60)
    load = cluster.constant_load(name, rate=pick(12, 16), duration=duration, chats=pick(20, 40))
    kills = 0
    for _ in range(pick(1, 3)):
        time.sleep(duration / (pick(1, 3) + 1))
        pid = victim.pid
        wait_until(lambda: _in_hand(cluster, "hostA", pid) >= 2, timeout=20,  # noqa: B023 - called here
                   what="the main process holding popped messages")
        held = _in_hand(cluster, "hostA", pid)
        cluster.kill_main(victim)  # its child finishes what it runs, then goes
        kills += 1
        time.sleep(1.0)
        cluster.reap(victim)
        victim = cluster.worker(lane, concurrency=1, host="hostA")
    load.wait(timeout=duration + 120)
    rep, stalled = _check(cluster, [load], scenario="L1 main process killed holding popped messages",
                          scenario_id="L1-main-killed-holding-popped",
                          lane=lane, record=record, started=started, extra={"kills": kills})
    assert held >= 2
    assert rep.accepted > 0 and rep.accounted, rep.summary()
    _assert_moved(rep, stalled)


def test_l2_pool_child_killed_mid_task(cluster_factory, record):
    """SIGKILL a pool child while its handler runs (the main process lives on)."""
    started = time.time()
    cluster = cluster_factory(env=PRODUCTION_LEASES)
    lane = unique("fl-lv-child")
    name = cluster.http_type(lane)
    cluster.sink.sink.behaviour.delay_s = (0.2, 0.6)
    victim, _ = cluster.workers_at_once(lane, [{"concurrency": 2, "host": "hostA"},
                                                {"concurrency": 2, "host": "hostB"}])
    duration = pick(LOAD_S, 60)
    load = cluster.constant_load(name, rate=pick(8, 12), duration=duration, chats=pick(20, 40))
    kills = 0
    stop = threading.Event()

    def killer() -> None:
        nonlocal kills
        while not stop.wait(pick(3.0, 6.0)):  # at least two kills within the short load
            children = victim.children()
            if children:
                os.kill(children[kills % len(children)], signal.SIGKILL)
                kills += 1

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    load.wait(timeout=duration + 120)
    stop.set()
    thread.join(timeout=30)
    rep, stalled = _check(cluster, [load], scenario="L2 pool child killed mid-task",
                          scenario_id="L2-pool-child-killed", lane=lane, record=record,
                          started=started, extra={"kills": kills})
    assert kills >= 2
    assert rep.accepted > 0 and rep.accounted, rep.summary()
    assert stalled == 0, rep.examples.get("stalled_chats")


def test_l3_whole_host_killed(cluster_factory, record):
    """Two simulated hosts share Redis and the database; every process of one dies at once."""
    started = time.time()
    cluster = cluster_factory(env=PRODUCTION_LEASES)
    lane = unique("fl-lv-host")
    name = cluster.http_type(lane)
    cluster.sink.sink.behaviour.delay_s = (0.05, 0.3)
    cluster.workers_at_once(lane, [{"concurrency": 2, "host": "hostA"},
                                   {"pool": "threads", "concurrency": 2, "host": "hostA"},
                                   {"concurrency": 2, "host": "hostB"}])
    duration = pick(LOAD_S, 60)
    load = cluster.constant_load(name, rate=pick(12, 20), duration=duration, chats=pick(24, 48))
    time.sleep(duration / 3)
    procs_a = [m for m in cluster.client().zrange(keys.PROCS, 0, -1) if m.startswith(b"hostA:")]
    victims = cluster.kill_host("hostA")
    if pick(False, True):
        time.sleep(duration / 3)
        cluster.worker(lane, concurrency=2, host="hostA")
    load.wait(timeout=duration + 120)
    rep, stalled = _check(cluster, [load], scenario="L3 whole host killed",
                          scenario_id="L3-whole-host-killed", lane=lane, record=record,
                          started=started, extra={"host_processes_killed": len(procs_a)})
    assert len(victims) == 2 and len(procs_a) >= 3  # two main processes, pool children, all beating
    assert rep.accepted > 0 and rep.accounted, rep.summary()
    _assert_moved(rep, stalled)


@long_only("l1-l3 (killed processes and hosts) run here")
def test_l4_a_stopped_pool_child_is_not_taken_over_before_its_lease(cluster_factory, record):
    """SIGSTOP a pool child mid-task for longer than its liveness (5 s), well within its lease
    (30 s): its host vouches for it, nobody else runs its task, and it finishes once woken."""
    started = time.time()
    cluster = cluster_factory(env=PRODUCTION_LEASES)
    lane = unique("fl-lv-stop")
    name = cluster.http_type(lane, attempt_timeout=60)  # the stop must not look like a slow attempt
    victim = cluster.worker(lane, concurrency=1, host="hostA")
    load = cluster.constant_load(name, rate=2, duration=1.5, chats=1,
                                 mix=[{"kind": "slow", "type": name, "weight": 1, "payload": {"sink_delay_s": 4}}])
    sink = cluster.sink.sink
    wait_until(lambda: sink.in_flight and max(sink.in_flight.values()) > 0, timeout=30, what="a task in flight")
    cluster.worker(lane, concurrency=2, host="hostB")  # a live worker that could take it over
    child = victim.children()[0]
    os.kill(child, signal.SIGSTOP)
    try:
        time.sleep(leases_ttl_s() + 6)  # its beat is long gone; its lease is not
        vouched = cluster.client().zscore(keys.PROCS_VOUCHED, f"hostA:{child}")
    finally:
        os.kill(child, signal.SIGCONT)
    load.wait(timeout=120)
    rep, _stalled = _check(cluster, [load], scenario="L4 pool child stopped (SIGSTOP) mid-task",
                          scenario_id="L4-pool-child-stopped", lane=lane, record=record, started=started,
                          extra={"stopped_s": leases_ttl_s() + 6})
    assert vouched is not None and vouched > 0
    assert rep.accepted >= 2 and rep.accounted, rep.summary()
    assert rep.redeliveries == 0, "a stopped process's task was taken over before its lease ran out"


def leases_ttl_s() -> float:
    from lanes.leases import LIVENESS_TTL_S

    return LIVENESS_TTL_S
