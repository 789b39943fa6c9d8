"""Measurement (not part of ``make test``): recovery sweeps against a backlog of 100,000 tasks.

Run: ``.venv/bin/python -m pytest tests/integration/bench_backlog.py -s -q`` (about 2 minutes a variant).
Side by side, in one run: a probe of 100 dispatches/s on one lane with no backlog, then the
same probe while 100,000 tasks wait on another lane past every lease, with the maintenance
loop (promote, expire, reclaim, lease sweep) running every 0.2 s, sweep included every pass
(production sweeps every few seconds). Redis' SLOWLOG logs every command during each phase
(threshold 0): per script, its calls' median and largest time, the calls over 1 ms, and where
those fall in the sequence of script calls. A control follows: as many calls of a script that
only spins for the sweep's median time, paced alike, so that what the machine adds to any call
of that length is read beside the sweep's. Numbers are printed and recorded in BENCHMARKS.md;
nothing here asserts a speed.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from lanes import keys
from lanes.lua.loader import script
from tasks import maintenance
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique
from tools.loadcheck import percentiles

BACKLOG = 100_000
PROBE_RATE = 100
PROBE_S = 20
SLOWLOG_LEN = 400_000


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


def _script_calls(rc, shas: dict[str, str]) -> list[tuple[str, float]]:
    """Every EVAL/EVALSHA Redis ran since the last SLOWLOG reset, oldest first: (script name or '?', ms).

    The SLOWLOG logs every command here (threshold 0), so the list is complete and its order is
    Redis' order: a slow call can be placed in the sequence of script calls.
    """
    names = {sha: name for name, sha in shas.items()}
    calls = []
    for entry in reversed(rc.slowlog_get(SLOWLOG_LEN)):
        args = [a.decode() if isinstance(a, bytes) else str(a) for a in entry["command"].split()] \
            if isinstance(entry["command"], (bytes, str)) else []
        if args and args[0].upper() in ("EVALSHA", "EVAL"):
            calls.append((names.get(args[1], "?") if len(args) > 1 else "?", entry["duration"] / 1000))
    return calls


def _report(calls: list[tuple[str, float]]) -> dict[str, object]:
    """Per script: calls, median and largest ms, calls over 1 ms; and where the slow calls fall in the
    sequence of script calls (Redis 6.2 steps Lua's GC inside every 50th EVAL/EVALSHA, whichever script)."""
    out: dict[str, object] = {}
    for name in sorted({n for n, _ in calls}):
        times = sorted(ms for n, ms in calls if n == name)
        out[name] = {"calls": len(times), "p50_ms": round(times[len(times) // 2], 3), "max_ms": round(times[-1], 3),
                     "over_1ms": sum(1 for t in times if t > 1)}
    slow = [i for i, (_, ms) in enumerate(calls) if ms > 1]
    out["slow_positions_mod_50"] = sorted({i % 50 for i in slow})
    out["slow_calls"] = [(calls[i][0], round(calls[i][1], 3)) for i in slow][:20]
    return out


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


def _realtime(pid: int, on: bool) -> str:
    """Run Redis under SCHED_FIFO (root only) so the OS never preempts it for another process: its
    SLOWLOG times are then its own work. On this shared 2-core machine a preempted Redis logs a
    0.2 ms script as several ms, whichever script it is (admit.lua among them)."""
    try:
        os.sched_setscheduler(pid, os.SCHED_FIFO if on else os.SCHED_OTHER, os.sched_param(10 if on else 0))
        return "SCHED_FIFO" if on else "SCHED_OTHER"
    except (PermissionError, OSError) as exc:
        return f"not changed ({exc})"


#: A script that only spins: ARGV[1] iterations of arithmetic, no key, no allocation.
SPIN = "local x = 0 for i = 1, tonumber(ARGV[1]) do x = x + i % 7 end return x"


def _control(rc, redis_server, policy: str, target_ms: float, calls: int = 2250, seconds: float = 20) -> dict:
    """As many calls as the sweep made, of a script that only spins for the sweep's median time, paced
    over the same 20 s: its calls over 1 ms are what the machine adds to any call of that length."""
    sha = rc.script_load(SPIN)
    spins = 1000
    for _ in range(8):  # calibrate on Redis' own clock (SLOWLOG)
        rc.config_set("slowlog-log-slower-than", 0)
        rc.slowlog_reset()
        for _ in range(20):
            rc.evalsha(sha, 0, spins)
        took = sorted(e["duration"] for e in rc.slowlog_get(64) if "EVALSHA" in str(e["command"]))
        median_us = took[len(took) // 2] if took else 1
        spins = max(1, int(spins * target_ms * 1000 / max(median_us, 1)))
    if policy == "realtime":
        _realtime(redis_server.proc.pid, True)
    rc.config_set("slowlog-log-slower-than", 0)
    rc.config_set("slowlog-max-len", SLOWLOG_LEN)
    rc.slowlog_reset()
    start = time.perf_counter()
    for i in range(calls):
        delay = start + i * seconds / calls - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        rc.evalsha(sha, 0, spins)
    times = sorted(e["duration"] / 1000 for e in rc.slowlog_get(SLOWLOG_LEN) if "EVALSHA" in str(e["command"]))
    rc.config_set("slowlog-log-slower-than", 10000)
    rc.config_set("slowlog-max-len", 128)
    if policy == "realtime":
        _realtime(redis_server.proc.pid, False)
    return {"calls": len(times), "p50_ms": round(times[len(times) // 2], 3) if times else None,
            "max_ms": round(times[-1], 3) if times else None, "over_1ms": sum(1 for t in times if t > 1)}


@pytest.mark.parametrize("policy", ["shared", "realtime"])
def test_backlog_bench(rc, redis_server, policy):
    probe_type, probe_lane = unique("bb-probe"), unique("l-bb-probe")
    back_type, back_lane = unique("bb-back"), unique("l-bb-back")
    # Deadlines past both variants: the first variant's probe tasks (no consumer) must not expire
    # during the second, whose SLOWLOG would then hold expire.lua's work on them.
    define(probe_type, lane=probe_lane, capacity=10_000_000, timeout=3600)
    define(back_type, lane=back_lane, capacity=10_000_000, timeout=3600)
    # Every script the probe and the maintenance loop run: a slow sweep call is read against the
    # others' (Redis 6.2 steps Lua's garbage collector inside every 50th script call, whichever it is).
    shas = {name: script(name).sha for name in ("sweep", "reclaim", "admit", "promote", "expire", "audit")}
    rc.config_set("slowlog-max-len", SLOWLOG_LEN)
    scheduled = _realtime(redis_server.proc.pid, True) if policy == "realtime" else "SCHED_OTHER"
    stopping = threading.Event()
    passes = {"n": 0}

    def loop() -> None:
        while not stopping.wait(0.2):
            maintenance.run_once(sweep_now=True)
            passes["n"] += 1

    threading.Thread(target=loop, daemon=True).start()
    forks = {}
    try:
        rc.config_set("slowlog-log-slower-than", 0)
        rc.slowlog_reset()
        forks["before"] = rc.info("stats")["total_forks"]
        before = _probe(probe_type)
        calls_before = _script_calls(rc, shas)
        forks["before"] = rc.info("stats")["total_forks"] - forks["before"]
        rc.config_set("slowlog-log-slower-than", 10000)
        queue, records = _backlog(rc, back_type)
        rc.config_set("slowlog-log-slower-than", 0)
        rc.slowlog_reset()
        forks["during"] = rc.info("stats")["total_forks"]
        during = _probe(probe_type)
        calls_during = _script_calls(rc, shas)
        forks["during"] = rc.info("stats")["total_forks"] - forks["during"]
    finally:
        stopping.set()
        rc.config_set("slowlog-log-slower-than", 10000)
        rc.config_set("slowlog-max-len", 128)
        if policy == "realtime":
            _realtime(redis_server.proc.pid, False)
    parked = sum(1 for s in rc.zmscore(keys.LEASES, records) if s == float("inf"))
    print(f"\nRedis scheduled {scheduled}")
    print(f"backlog {BACKLOG} waiting past every lease on {back_lane} ({rc.llen(queue)} in its list, "
          f"{parked} parked by the sweep); maintenance passes {passes['n']}; forks (AOF rewrites) {forks}")
    print(f"probe {PROBE_RATE}/s x {PROBE_S}s, no backlog: {percentiles(before)} ms; "
          f"script calls: {_report(calls_before)}")
    print(f"probe {PROBE_RATE}/s x {PROBE_S}s, with backlog: {percentiles(during)} ms; "
          f"script calls: {_report(calls_during)}")
    sweep_median = _report(calls_during)["sweep"]["p50_ms"]  # type: ignore[index]
    control = _control(rc, redis_server, policy, sweep_median)
    print(f"control, a Lua loop of the sweep's median time touching no key: {control}")
    pipe = rc.pipeline(transaction=False)
    for i in range(0, len(records), 1000):
        pipe.delete(*records[i:i + 1000])
        pipe.zrem(keys.LEASES, *records[i:i + 1000])
    pipe.delete(*keys.lane_queues(back_lane), *keys.lane_queues(probe_lane))
    pipe.execute()
