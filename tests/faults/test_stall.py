"""S1: the stall of scenarios 4 and 10, on purpose: Redis killed and restarted from its AOF again and
again under load, so that claims meet it away. A claim that never reached Redis leaves its task
'queued' while the worker's task fails and its message is acked; once its queued lease runs out,
the sweep finds the lane list busy and parks the lease, and the chat waited for its deadline
(FAULTS.md, "The stuck chat of scenarios 4 and 10"). The chat audit now moves such a head on."""

from __future__ import annotations

import threading
import time

from tests.faults.harness import drain_and_check, long_only, pick
from tests.support.helpers import unique


@long_only("a soak scenario (make soak; make faults): about a minute and a half")
def test_s1_claims_that_meet_redis_down_leave_no_chat_stuck(cluster_factory, record):
    started = time.time()
    cluster = cluster_factory(env={"DISPATCH_REDIS_TIMEOUT_S": "3"})
    lane = unique("fl-stall")
    name = cluster.http_type(lane, attempt_timeout=4)
    cluster.sink.sink.behaviour.delay_s = (0.02, 0.2)
    for pool, concurrency in (("prefork", 2), ("prefork", 2), ("threads", 4)):
        cluster.worker(lane, pool=pool, concurrency=concurrency)
    duration = pick(30, 45)
    load = cluster.constant_load(name, rate=pick(25, 30), duration=duration, chats=pick(30, 40))
    outages = 0
    stop = threading.Event()

    def outage() -> None:
        nonlocal outages
        while not stop.wait(2.5) and time.time() - started < duration - 5:
            cluster.redis_kill()
            time.sleep(1.0)
            cluster.redis_restart()
            outages += 1

    thread = threading.Thread(target=outage, daemon=True)
    thread.start()
    load.wait(timeout=duration + 180)
    stop.set()
    thread.join(timeout=60)
    rep = drain_and_check(cluster, [load], scenario="S1 claims meet Redis down", drain_bound=pick(90, 120),
                          lanes=[lane])
    rep.extra.update(outages=outages, sweep_republished=cluster.sweep_republished())
    record("S1-claims-meet-redis-down", rep, started)
    assert outages >= 4
    assert rep.accepted > 0 and rep.accounted, rep.summary()
