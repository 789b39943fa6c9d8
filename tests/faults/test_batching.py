"""Scenario 13: batched handlers under SIGKILL (issue 16).

The load is the campaign's (chat-scoped, idempotency key per message) on a
batched type (``http.post_batch``, batches of up to 16); pool children and main
processes are SIGKILLed while batches run. A batch is an optimisation, never a
change of meaning: the checker's every measure must read as for the single path
(nothing lost, no duplicate effect, no order violation, nothing stuck).
"""

from __future__ import annotations

import os
import signal
import threading
import time

from tests.faults.harness import drain_and_check, long_only, pick
from tests.support.helpers import unique


@long_only("tests/integration/test_batching.py SIGKILLs a worker mid-batch here")
def test_13_sigkill_mid_batch(cluster_factory, record):
    """SIGKILL pool children (mid-batch) and main processes while batched tasks run."""
    started = time.time()
    cluster = cluster_factory()
    lane = unique("fl-batch")
    name = unique("f-batch")
    cluster.define(name, handler="http.post_batch", lane=lane, chat_scoped=True, chat_queue_size=256,
                   options={"url": cluster.sink.url}, timeout=600, attempt_timeout=10, batch_size=16,
                   batch_window_ms=5, policy={"max_retries": 8, "initial_backoff": 0.2, "multiplier": 2.0,
                                              "max_backoff": 2.0, "jitter": 0.2})
    # Slow enough per item that a backlog forms and batches hold several items when a kill lands.
    cluster.sink.sink.behaviour.delay_s = (0.03, 0.08)
    workers = [cluster.worker(lane, concurrency=2), cluster.worker(lane, concurrency=2)]
    duration = pick(14, 60)
    load = cluster.constant_load(name, rate=pick(60, 80), duration=duration, chats=pick(30, 60))
    kills = {"main": 0, "child": 0}
    stop = threading.Event()

    def killer() -> None:
        n = 0
        while not stop.wait(pick(3.0, 4.0)):
            victim = workers[n % len(workers)]
            if n % 3 == 2:
                cluster.kill_main(victim)
                kills["main"] += 1
                time.sleep(1.0)
                cluster.reap(victim)
                workers[n % len(workers)] = cluster.worker(lane, concurrency=2)
            else:
                children = victim.children()
                if children:
                    os.kill(children[n % len(children)], signal.SIGKILL)
                    kills["child"] += 1
            n += 1

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    load.wait(timeout=duration + 120)
    stop.set()
    thread.join(timeout=60)
    rep = drain_and_check(cluster, [load], scenario="13 SIGKILL mid-batch", drain_bound=pick(90, 120),
                          lanes=[lane])
    rep.extra["kills"] = kills
    with cluster.sink.sink.lock:
        sent = [a.headers.get("X-Dispatch-Batch", "") for a in cluster.sink.sink.attempts]
    rep.extra["batches"] = {"handler_calls": len(set(sent)), "requests": len(sent)}
    record("13-batch-sigkill", rep, started)
    assert kills["child"] >= 1 and kills["main"] >= 1
    assert rep.accepted > 0 and rep.accounted, rep.summary()
    assert all(w.alive() for w in workers)
    assert "" not in sent and len(set(sent)) < len(sent) / 2  # batched (two items a call or more on average)
