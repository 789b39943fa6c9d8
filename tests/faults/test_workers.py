"""Scenarios 1, 2, 5, 6: workers killed, restarted, outlived by their tasks, and poisoned."""

from __future__ import annotations

import signal
import threading
import time

from tests.faults.harness import drain_and_check, long_only, pick
from tests.support.helpers import unique


def _hammer(stop: threading.Event, every: float, action) -> threading.Thread:
    """Run ``action(n)`` every ``every`` seconds until ``stop`` is set, in a thread."""

    def loop() -> None:
        n = 0
        while not stop.wait(every):
            action(n)
            n += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


@long_only("L1 and L2 (tests/faults/test_liveness.py) kill a main process holding popped messages and a pool "
           "child mid-task here, and tests/integration/test_fifo.py a worker mid-message; this is the campaign "
           "of repeated kills under load")
def test_01_sigkill_worker_main_and_pool_children(cluster_factory, record):
    """SIGKILL a worker's main process every few seconds, and pool children mid-task."""
    started = time.time()
    cluster = cluster_factory()
    lane = unique("fl-kill")
    name = cluster.http_type(lane)
    cluster.sink.sink.behaviour.delay_s = (0.005, 0.03)
    workers = [cluster.worker(lane, concurrency=2), cluster.worker(lane, concurrency=2)]
    duration = pick(14, 60)
    load = cluster.constant_load(name, rate=pick(25, 40), duration=duration, chats=pick(30, 60))
    kills = {"main": 0, "child": 0}
    stop = threading.Event()

    def kill(n: int) -> None:
        victim = workers[n % len(workers)]
        if n % 3 == 0:
            cluster.kill_main(victim)  # orphaned children finish what they run, then go
            kills["main"] += 1
            time.sleep(1.0)
            cluster.reap(victim)
            workers[n % len(workers)] = cluster.worker(lane, concurrency=2)
        else:
            children = victim.children()
            if children:
                import os

                os.kill(children[n % len(children)], signal.SIGKILL)
                kills["child"] += 1

    thread = _hammer(stop, pick(3.0, 4.0), kill)
    load.wait(timeout=duration + 120)
    stop.set()
    thread.join(timeout=60)
    rep = drain_and_check(cluster, [load], scenario="1 SIGKILL workers", drain_bound=pick(90, 120), lanes=[lane])
    rep.extra["kills"] = kills
    record("01-sigkill-workers", rep, started)
    assert kills["main"] >= 1 and kills["child"] >= 1
    assert rep.accepted > 0 and rep.accounted, rep.summary()
    assert all(w.alive() for w in workers)


@long_only("SIGTERM restarts are a gentler case of scenario 1 (SIGKILL); tests/integration/test_fifo.py, "
           "test_hooks.py and test_postgres.py stop workers warm here, and tests/faults/test_found_defects.py "
           "checks a pop pending at shutdown")
def test_02_sigterm_restarts_under_load(cluster_factory, record):
    """Warm shutdowns (SIGTERM) and restarts, one worker at a time, under load: a message the
    consumer had popped when the shutdown began must not vanish."""
    started = time.time()
    cluster = cluster_factory()
    lane = unique("fl-term")
    name = cluster.http_type(lane)
    cluster.sink.sink.behaviour.delay_s = (0.005, 0.05)
    workers = [cluster.worker(lane, concurrency=2), cluster.worker(lane, pool="threads", concurrency=4)]
    duration = pick(14, 60)
    load = cluster.constant_load(name, rate=pick(25, 40), duration=duration, chats=pick(30, 60))
    stop = threading.Event()
    restarts = {"n": 0, "slowest_shutdown_s": 0.0}

    def restart(n: int) -> None:
        i = n % len(workers)
        victim = workers[i]
        t = time.monotonic()
        victim.stop(timeout=30)  # SIGTERM, wait; SIGKILL only if it lingers past 30 s
        restarts["slowest_shutdown_s"] = max(restarts["slowest_shutdown_s"], round(time.monotonic() - t, 1))
        workers[i] = cluster.worker(lane, pool=victim.pool, concurrency=victim.concurrency)
        restarts["n"] += 1

    thread = _hammer(stop, pick(2.0, 3.0), restart)
    load.wait(timeout=duration + 120)
    stop.set()
    thread.join(timeout=90)
    rep = drain_and_check(cluster, [load], scenario="2 SIGTERM restarts", drain_bound=pick(60, 90), lanes=[lane])
    rep.extra.update(restarts=restarts, sweep_republished=cluster.sweep_republished())
    record("02-sigterm-restarts", rep, started)
    assert restarts["n"] >= 2
    assert rep.accepted > 0 and rep.accounted and rep.concurrent_same_key == 0, rep.summary()
    # A warm shutdown hands back what it holds: nothing had to wait for the recovery sweep.
    assert rep.extra["sweep_republished"] == 0, rep.summary()


@long_only("tests/integration/test_reliability.py runs a retry and a task longer than the visibility timeout here")
def test_05_tasks_longer_than_the_visibility_timeout_and_retries_beyond_it(cluster_factory, record):
    """Lease = broker visibility timeout = 2 s; some sends take 3.5 s, some are told to retry after
    4 s. Lease renewal must keep a running task from being run again, and a retry parked past the
    visibility timeout must run once."""
    started = time.time()
    cluster = cluster_factory(env={"DISPATCH_LEASE_S": "2", "DISPATCH_QUEUED_LEASE_S": "4"})
    lane = unique("fl-vis")
    name = cluster.http_type(lane)
    cluster.worker(lane, concurrency=2)
    cluster.worker(lane, pool="threads", concurrency=6)
    duration = pick(10, 45)
    mix = [
        {"kind": "ok", "type": name, "weight": 2, "payload": {}},
        {"kind": "slow", "type": name, "weight": 1, "payload": {"sink_delay_s": 3.5}},
        {"kind": "retry-late", "type": name, "weight": 1, "payload": {"sink_fail_first": 1, "sink_retry_after": 4}},
    ]
    load = cluster.constant_load(name, rate=pick(3, 4), duration=duration, chats=pick(8, 16), mix=mix)
    load.wait(timeout=duration + 60)
    rep = drain_and_check(cluster, [load], scenario="5 longer than visibility", drain_bound=pick(90, 120),
                          lanes=[lane])
    record("05-visibility-timeout", rep, started)
    # No process dies here: one task in flight twice at once would be two live claims.
    assert rep.accepted > 0 and rep.accounted and rep.concurrent_same_key == 0, rep.summary()
    by_kind = rep.extra["by_kind"]
    assert set(by_kind) == {"ok", "slow", "retry-late"} and all(set(k) == {"succeeded"} for k in by_kind.values())
    # Each slow send reached the sink once, each retry-late twice (its 503, then its success).
    assert rep.redeliveries == by_kind["retry-late"]["succeeded"], rep.summary()


@long_only("tests/integration/test_reliability.py runs a poison task here; this is the campaign under load")
def test_06_poison_tasks_are_bounded_and_do_not_block_other_chats(cluster_factory, record):
    """Tasks that always fail (503) or kill their worker process (os._exit), mixed into busy chats."""
    from lanes import keys
    from tasks.models import DeadLetter

    started = time.time()
    cluster = cluster_factory()
    lane = unique("fl-poison")
    max_retries = 2
    name = cluster.http_type(lane, policy={"max_retries": max_retries, "initial_backoff": 0.1, "multiplier": 2.0,
                                           "max_backoff": 0.5, "jitter": 0.1})
    crash = unique("f-crash")
    cluster.define(crash, handler="demo.flaky", lane=lane, chat_scoped=True, chat_queue_size=256, timeout=600)
    workers = [cluster.worker(lane, concurrency=2), cluster.worker(lane, concurrency=2)]
    duration = pick(8, 40)
    mix = [
        {"kind": "ok", "type": name, "weight": 18, "payload": {}},
        {"kind": "fail", "type": name, "weight": 1, "payload": {"sink_status": 503}},
        {"kind": "crash", "type": crash, "weight": 1, "payload": {"fail": "crash"}},
    ]
    load = cluster.constant_load(name, rate=pick(10, 15), duration=duration, chats=pick(12, 24), mix=mix)
    load.wait(timeout=duration + 60)
    rep = drain_and_check(cluster, [load], scenario="6 poison", drain_bound=pick(90, 150), lanes=[lane])
    ops = load.ops()
    crash_ids = {op.task_id for op in ops if op.kind == "crash" and op.accepted}
    starts = int(cluster.client().hget(keys.METRICS_TOTAL, f"started|{lane}|{crash}") or 0)
    fail_keys = {op.key for op in ops if op.kind == "fail" and op.accepted}
    fail_attempts = [a for a in cluster.sink.sink.attempts if a.key in fail_keys]
    rep.extra.update(crash_tasks=len(crash_ids), crash_starts=starts, fail_tasks=len(fail_keys),
                     fail_attempts=len(fail_attempts))
    record("06-poison", rep, started)
    assert rep.accepted > 0 and rep.accounted, rep.summary()
    by_kind = rep.extra["by_kind"]
    assert by_kind["ok"] == {"succeeded": by_kind["ok"]["succeeded"]}
    assert by_kind["fail"] == {"dead:exhausted": len(fail_keys)}
    assert by_kind["crash"] == {"dead:poison": len(crash_ids)}
    # Bounded: one dead letter each, max_retries + 1 sends per failing task, at most
    # DISPATCH_MAX_DELIVERIES starts per crashing one (no hot loop).
    assert DeadLetter.objects.filter(task_id__in=crash_ids).count() == len(crash_ids)
    assert len(fail_attempts) == len(fail_keys) * (max_retries + 1)
    assert starts <= len(crash_ids) * 3, rep.summary()
    assert all(w.alive() for w in workers)
