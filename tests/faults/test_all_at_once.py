"""Scenario 10: everything at once: load, worker SIGKILLs and SIGTERM restarts, one Redis restart."""

from __future__ import annotations

import os
import signal
import threading
import time

from tests.faults.harness import drain_and_check, long_only, pick
from tests.support.helpers import unique


@long_only("each of its faults runs here on its own (L1 and L2 kills, 3a, 4); together they are the campaign")
def test_10_all_at_once(cluster_factory, record):
    started = time.time()
    cluster = cluster_factory(env={"DISPATCH_REDIS_TIMEOUT_S": "3"})
    lane = unique("fl-all")
    name = cluster.http_type(lane, policy={"max_retries": 3, "initial_backoff": 0.1, "multiplier": 2.0,
                                           "max_backoff": 1.0, "jitter": 0.2})
    cluster.sink.sink.behaviour.delay_s = (0.005, 0.04)
    cluster.sink.sink.behaviour.fail_fraction_first = 0.05
    workers = [cluster.worker(lane, concurrency=2), cluster.worker(lane, concurrency=2),
               cluster.worker(lane, pool="threads", concurrency=4)]
    duration = pick(24, 60)
    mix = [{"kind": "ok", "type": name, "weight": 18, "payload": {}},
           {"kind": "fail", "type": name, "weight": 1, "payload": {"sink_status": 503}},
           {"kind": "slow", "type": name, "weight": 1, "payload": {"sink_delay_s": 1.0}}]
    load = cluster.constant_load(name, rate=pick(20, 30), duration=duration, chats=pick(30, 60), mix=mix)
    done = {"kill_main": 0, "kill_child": 0, "sigterm": 0, "redis_restart": 0}
    stop = threading.Event()

    def chaos() -> None:
        t0 = time.time()
        n = 0
        while not stop.wait(pick(3.0, 4.0)):
            if not done["redis_restart"] and time.time() - t0 > duration / 2:
                cluster.redis_kill()
                time.sleep(2.0)
                cluster.redis_restart()
                done["redis_restart"] += 1
                continue
            i = n % len(workers)
            victim = workers[i]
            action = ("kill_main", "kill_child", "sigterm")[n % 3]
            n += 1
            if action == "kill_child":
                children = victim.children()
                if children and victim.pool == "prefork":
                    os.kill(children[0], signal.SIGKILL)
                    done[action] += 1
                continue
            if action == "kill_main":
                cluster.kill_main(victim)
                time.sleep(0.5)
                cluster.reap(victim)
            else:
                victim.stop(timeout=30)
            done[action] += 1
            workers[i] = cluster.worker(lane, pool=victim.pool, concurrency=victim.concurrency)

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    load.wait(timeout=duration + 180)
    stop.set()
    thread.join(timeout=120)
    rep = drain_and_check(cluster, [load], scenario="10 all at once", drain_bound=pick(90, 120), lanes=[lane])
    rep.extra.update(faults=done, sweep_republished=cluster.sweep_republished())
    record("10-all-at-once", rep, started)
    assert done["redis_restart"] == 1 and done["kill_main"] >= 1 and done["sigterm"] >= 1
    assert rep.accepted > 0 and rep.accounted, rep.summary()
    assert rep.extra["by_kind"]["fail"].keys() <= {"dead:exhausted", "dead:poison"}
