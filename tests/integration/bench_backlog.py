"""Measurement (not part of ``make test``): recovery sweeps against a backlog of 100,000 tasks.

Run: ``.venv/bin/python -m pytest tests/integration/bench_backlog.py -s -q`` (about 2 minutes).
Side by side, in one run: a probe of 100 dispatches/s on one lane with no backlog, then the
same probe while 100,000 tasks wait on another lane past every lease, with the maintenance
loop (promote, expire, reclaim, lease sweep) running every 0.2 s, sweep included every pass
(production sweeps every few seconds). Redis' SLOWLOG (threshold 1 ms) is read after each
phase for the sweep and reclaim scripts. Numbers are printed and recorded in BENCHMARKS.md;
nothing here asserts a speed.
"""

from __future__ import annotations

import threading
import time

from lanes import keys
from lanes.lua.loader import script
from tasks import maintenance
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique
from tools.loadcheck import percentiles

BACKLOG = 100_000
PROBE_RATE = 100
PROBE_S = 20


def _probe(type_name: str) -> list[float]:
    latencies = []
    start = time.perf_counter()
    for i in range(PROBE_RATE * PROBE_S):
        due = start + i / PROBE_RATE
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter()
        assert dispatch.delay(type_name, {"i": i}).accepted
        latencies.append((time.perf_counter() - t0) * 1000)
    return latencies


def _slow_scripts(rc, shas: dict[str, str]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {name: [] for name in shas}
    for entry in rc.slowlog_get(128):
        args = [a.decode() if isinstance(a, bytes) else str(a) for a in entry["command"].split()] \
            if isinstance(entry["command"], (bytes, str)) else []
        for name, sha in shas.items():
            if len(args) > 1 and args[0].upper() == "EVALSHA" and args[1] == sha:
                found[name].append(entry["duration"] / 1000)
    return found


def _backlog(rc, lane_type: str) -> tuple[str, list[str]]:
    first = dispatch.delay(lane_type, {"n": 0})
    template = {k.decode(): v for k, v in rc.hgetall(keys.task_record(first.task_id)).items()}
    queue = template["q"].decode()
    message = rc.lindex(queue, 0)
    prefix = unique("bb")
    records = [keys.task_record(f"{prefix}-{i}") for i in range(BACKLOG)]
    expired = int((time.time() - 3600) * 1000)
    pipe = rc.pipeline(transaction=False)
    for n, record in enumerate(records, 1):
        pipe.hset(record, mapping={**template, "pub": 1})
        pipe.lpush(queue, message)
        pipe.zadd(keys.LEASES, {record: expired})
        if n % 2000 == 0:
            pipe.execute()
    pipe.execute()
    return queue, records


def test_backlog_bench(rc):
    probe_type, probe_lane = unique("bb-probe"), unique("l-bb-probe")
    back_type, back_lane = unique("bb-back"), unique("l-bb-back")
    define(probe_type, lane=probe_lane, capacity=10_000_000)
    define(back_type, lane=back_lane, capacity=10_000_000)
    # Every script the probe and the maintenance loop run: a slow sweep call is read against the
    # others' (Redis 6.2 steps Lua's garbage collector inside every 50th script call, whichever it is).
    shas = {name: script(name).sha for name in ("sweep", "reclaim", "admit", "promote", "expire", "audit")}
    rc.config_set("slowlog-log-slower-than", 1000)
    stopping = threading.Event()
    passes = {"n": 0}

    def loop() -> None:
        while not stopping.wait(0.2):
            maintenance.run_once(sweep_now=True)
            passes["n"] += 1

    threading.Thread(target=loop, daemon=True).start()
    try:
        rc.slowlog_reset()
        before = _probe(probe_type)
        slow_before = _slow_scripts(rc, shas)
        queue, records = _backlog(rc, back_type)
        rc.slowlog_reset()
        during = _probe(probe_type)
        slow_during = _slow_scripts(rc, shas)
    finally:
        stopping.set()
        rc.config_set("slowlog-log-slower-than", 10000)
    parked = sum(1 for s in rc.zmscore(keys.LEASES, records) if s == float("inf"))
    print(f"\nbacklog {BACKLOG} waiting past every lease on {back_lane} ({rc.llen(queue)} in its list, "
          f"{parked} parked by the sweep); maintenance passes {passes['n']}")
    print(f"probe {PROBE_RATE}/s x {PROBE_S}s, no backlog: {percentiles(before)} ms; "
          f"script calls over 1 ms: { {k: len(v) for k, v in slow_before.items()} }")
    print(f"probe {PROBE_RATE}/s x {PROBE_S}s, with backlog: {percentiles(during)} ms; "
          f"script calls over 1 ms (count, longest ms): "
          f"{ {k: (len(v), max(v, default=0)) for k, v in slow_during.items()} }")
    pipe = rc.pipeline(transaction=False)
    for i in range(0, len(records), 1000):
        pipe.delete(*records[i:i + 1000])
        pipe.zrem(keys.LEASES, *records[i:i + 1000])
    pipe.delete(*keys.lane_queues(back_lane), *keys.lane_queues(probe_lane))
    pipe.execute()
