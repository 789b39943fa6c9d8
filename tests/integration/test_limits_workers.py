"""Limits with real worker processes: rate, in-flight cap across a SIGKILL, fair share, Retry-After.

Every time measured is a task's start as the loopback sink saw it (``Attempt.started``);
the assertions are counts and rates of those starts, never how fast the suite ran.
"""

from __future__ import annotations

import socket
import time

from lanes import keys
from tasks import config
from tasks.dispatch import admit
from tasks.models import DeadLetter, Limit, TaskTypeLimit
from tests.support.helpers import busiest_second, define, first_starts, unique, wait_until
from tests.support.http_sink import SinkServer


def limited_http_type(sink, lane: str, limits: list[Limit], **fields) -> str:
    name = unique("lim")
    tt = define(name, handler="http.post", lane=lane, options={"url": sink.url}, timeout=120, **fields)
    for i, lim in enumerate(limits):
        TaskTypeLimit.objects.create(task_type=tt, limit=lim, position=i)
    config.forget()
    return name


def make_limit(**fields) -> Limit:
    lim = Limit(name=unique("l"), **fields)
    lim.full_clean()
    lim.save()
    return lim


def starts(sink, attempt: int | None = None) -> list[float]:
    with sink.sink.lock:
        return sorted(a.started for a in sink.sink.attempts if attempt is None or a.attempt == attempt)


def max_concurrent(sink, attempts=None) -> int:
    if attempts is None:
        with sink.sink.lock:
            attempts = list(sink.sink.attempts)
    edges = sorted([(a.started, 1) for a in attempts] + [(a.at, -1) for a in attempts])
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


def test_a_global_rate_holds_across_two_workers(start_worker, sink, rc):
    lane = unique("lr")
    rate, burst, n = 20, 20, 240
    lim = make_limit(scope="global", rate=rate, burst=burst)
    name = limited_http_type(sink, lane, [lim])
    start_worker.many(2, lane, pool="threads", concurrency=6)
    ids = [admit(name, {"n": i}).task_id for i in range(n)]
    assert all(ids)
    wait_until(lambda: len(sink.sink.applied) >= n, timeout=60, what="every task applied")
    t = starts(sink)
    assert len(t) == n  # each ran once: nothing lost, nothing retried
    # No 1-second window holds more than rate + burst starts. Counted at each attempt's start by its
    # worker's clock, right after the claim that took the bucket's token (its history): the sink sees a
    # start only when the run thread's request reaches it, and a loaded host delays some requests more
    # than others (41-45 and 51 of a bound of 40 were seen at the sink under CI's load). Two tokens' worth
    # of the two workers' clocks and a claim's reply is allowed; a bucket that let its burst through
    # twice, or no bucket, fails.
    worst = busiest_second(first_starts(ids))
    assert worst <= rate + burst + 2, worst
    # Past the burst, starts follow the rate (demand exceeds it the whole time): by the last start,
    # the bucket allowed ``burst + rate x elapsed`` and no more, within 5 %. (Measured from the first
    # start, not from the burst's last: a worker that drains the burst at once starts the tokens
    # that refilled meanwhile at once too, which a rate taken from there counts as excess.)
    mean = (len(t) - burst) / (t[-1] - t[0])
    assert abs(mean - rate) <= 0.05 * rate, mean
    assert not DeadLetter.objects.filter(task_type=name).exists()
    assert not rc.exists(keys.lane_limited(lane), keys.limit_waiting(keys.limit_base(lim.name)))


def test_max_in_flight_holds_and_a_killed_workers_slots_come_back(start_worker, sink, rc):
    lane = unique("lm")
    lim = make_limit(scope="global", max_in_flight=3)
    name = limited_http_type(sink, lane, [lim])
    victim = start_worker(lane, pool="threads", concurrency=6)
    results = [admit(name, {"n": i, "sink_delay_s": 1.5}) for i in range(9)]
    base = keys.limit_base(lim.name)
    wait_until(lambda: len(starts(sink)) >= 3, timeout=30, what="three running")
    assert rc.scard(keys.limit_holding(base)) == 3
    victim.kill()  # SIGKILL: three tasks die holding the three slots
    killed_at = time.time()
    start_worker(lane, pool="threads", concurrency=6)
    for r in results:
        assert r.get(timeout=90) == {"status": 200}
    # The slots came back with the dead tasks (their lease ran out, the sweep republished them,
    # each finished once and released its slot); the cap held the whole time.
    # The killed worker's requests stay in the provider's hands until it answers them (the sink's
    # delay), after their slots came back with the dead process: a cap cannot see past a dead
    # caller. It holds among what was sent before the kill, and among what was sent after it.
    with sink.sink.lock:
        attempts = list(sink.sink.attempts)
    assert max_concurrent(sink, [a for a in attempts if a.started <= killed_at]) <= 3
    assert max_concurrent(sink, [a for a in attempts if a.started > killed_at]) <= 3
    assert len(sink.sink.applied) == 9
    resumed = [s for s in starts(sink) if s > killed_at]
    assert resumed and resumed[0] - killed_at < 6 + 3  # within a lease (6 s) plus a sweep period
    wait_until(lambda: not rc.exists(keys.limit_holding(base), keys.limit_instances(lim.name)), timeout=10,
               what="no slot left held")


def test_fair_share_a_small_key_is_not_stuck_behind_a_flood(start_worker, sink, rc):
    lane = unique("lf")
    window = 8
    lim = make_limit(scope="key", fair_share=True, window=window)
    name = limited_http_type(sink, lane, [lim])
    define(name, handler="http.post", lane=lane, options={"url": sink.url}, timeout=600, capacity=200000)
    config.forget()
    flood = [admit(name, {"k": "big", "n": i}, limit_key="big") for i in range(5000)]
    assert all(r.accepted for r in flood)
    start_worker(lane, pool="threads", concurrency=8)
    wait_until(lambda: len(starts(sink)) >= 50, timeout=60, what="the flood running")
    small = [admit(name, {"k": "small", "n": i}, limit_key="small") for i in range(20)]
    sent_at = time.time()
    for r in small:
        r.get(timeout=60)
    with sink.sink.lock:
        # The window closes when the sink saw small's last start, not when this process
        # polled its result (the flood keeps running meanwhile).
        done_at = max(a.started for a in sink.sink.attempts if a.body.get("k") == "small")
        big_between = sum(1 for a in sink.sink.attempts if a.body.get("k") == "big" and sent_at <= a.started <= done_at)
        small_starts = sorted(round(a.started - sent_at, 3) for a in sink.sink.attempts if a.body.get("k") == "small")
    # Round robin between two keys of weight 1: while small's 20 run, big gets one turn per small
    # task, plus what was already published (the window): a bound in tasks, not the flood's 5,000.
    # (Small's starts in the message: one late alone is a stall on its way to the sink, all late the gate.)
    assert big_between <= 20 + 2 * window, (big_between, small_starts)
    assert done_at - sent_at < 30  # stated bound; the flood alone would need its whole drain


def test_the_sink_holds_a_burst_of_connections_until_it_accepts_them():
    # The fair-share bound counts starts at the sink: a connection it dropped (a full listen backlog
    # while its accept thread waits for a CPU) reaches it only at TCP's retry 1 s later, a second of
    # the flood's starts counted against the gate. Not serving yet is that wait, made to last.
    server = SinkServer()
    host, port = server.server.server_address[:2]
    burst: list[socket.socket] = []
    try:
        for i in range(32):  # more than the workers of these tests connect at once
            try:
                burst.append(socket.create_connection((host, port), timeout=3))
            except TimeoutError:
                raise AssertionError(f"connection {i + 1} of 32 dropped by the sink's listen backlog") from None
        with server:
            for conn in burst:
                conn.sendall(b"POST /hook HTTP/1.1\r\nHost: sink\r\nContent-Length: 2\r\n\r\n{}")
            answers = [conn.makefile("rb").readline() for conn in burst]
        assert answers == [b"HTTP/1.0 200 OK\r\n"] * 32
        assert len(server.sink.attempts) == 32
    finally:
        for conn in burst:
            conn.close()
        server.server.server_close()


def test_fair_share_weights_divide_completions(start_worker, sink, rc):
    lane = unique("lw")
    lim = make_limit(scope="key", fair_share=True, window=4, weights={"a": 3, "b": 1})
    name = limited_http_type(sink, lane, [lim])
    for i in range(300):
        admit(name, {"k": "a", "n": i}, limit_key="a")
        admit(name, {"k": "b", "n": i}, limit_key="b")
    start_worker(lane, pool="threads", concurrency=4)
    wait_until(lambda: len(starts(sink)) >= 240, timeout=60, what="240 tasks run")
    with sink.sink.lock:
        first = sorted(sink.sink.attempts, key=lambda a: a.started)[:240]
    a = sum(1 for x in first if x.body.get("k") == "a")
    b = len(first) - a
    assert abs(a / b - 3) <= 0.3, (a, b)


def test_retry_after_holds_every_task_of_the_key(start_worker, sink, rc):
    lane = unique("la")
    lim = make_limit(scope="key", rate=100, burst=100)
    name = limited_http_type(sink, lane, [lim], policy={"max_retries": 3, "initial_backoff": 0.1})
    start_worker(lane, pool="threads", concurrency=4)
    base = keys.limit_base(lim.name, "s1")
    first = admit(name, {"sink_fail_first": 1, "sink_retry_after": "2"}, limit_key="s1")
    wait_until(lambda: rc.exists(keys.limit_paused(base)), timeout=30, what="the key paused by Retry-After")
    paused_until = time.time() + rc.pttl(keys.limit_paused(base)) / 1000
    same = [admit(name, {"k": "s1", "n": i}, limit_key="s1") for i in range(5)]
    other = [admit(name, {"k": "s2", "n": i}, limit_key="s2") for i in range(3)]
    for r in [first, *same, *other]:
        r.get(timeout=30)
    with sink.sink.lock:
        s1 = [a.started for a in sink.sink.attempts if a.body.get("k") == "s1"]
        s2 = [a.started for a in sink.sink.attempts if a.body.get("k") == "s2"]
    assert paused_until - time.time() < 0 and min(s1) >= paused_until - 0.05, (min(s1), paused_until)
    assert max(s2) < paused_until  # another key never waited
