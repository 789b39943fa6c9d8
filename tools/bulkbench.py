"""``manage.py bulkbench``: ``dispatch_many`` against a loop of ``dispatch.delay``, side by side in one run.

The orchestrator reuses ``tools.benchmark.Bench`` for its scratch Redis and
SQLite database and its task types, then runs the producer in its own process
(``manage.py bulkbench --role produce``): each round dispatches N items of the
plain type both ways, in alternating order, nobody consuming; items/s =
N / (first call .. last answer), payloads built inside the timing both ways.
It also records Redis commands and round trips per item (``INFO commandstats``,
``tools.probe``). The target is ``dispatch_many`` at least 10 times the loop.
"""

from __future__ import annotations

import contextlib
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

MODES = {
    "loop": "a loop of dispatch.delay(type, payload)",
    "dispatch_many": "dispatch_many(type, payloads), one round trip per chunk",
}


def run_bulkbench(*, items: int = 5000, rounds: int = 3, warmup: int = 200, redis_url: str | None = None,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Start a scratch Redis and database, measure, stop them; returns the report (see ``produce_bulk``)."""
    from tools.benchmark import Bench, BenchOptions, machine_info

    bench = Bench(BenchOptions(rounds=rounds, redis_url=redis_url), progress=progress)
    started = time.time()
    try:
        (progress or (lambda line: None))("bulkbench: starting Redis and the scratch database")
        bench.setup()
        spec = json.dumps({"items": items, "rounds": rounds, "warmup": warmup})
        out = bench._manage("bulkbench", "--role", "produce", "--spec", spec, timeout=3600)
    finally:
        bench.teardown()
    report = json.loads(out)
    report.update(machine=machine_info(), seconds=round(time.time() - started, 1))
    return report


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block, as ``timeit`` does, and restore it after.

    An opt-in of this benchmark around its ``dispatch_many`` call, which makes
    tens of thousands of objects that live until it returns: the collector's
    generation thresholds then walked the caller's whole heap about once per
    5,000 items, a fifth of the call's time. Never inside the library: the
    collector is the whole interpreter's (every thread of a server process).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def produce_bulk(spec: dict[str, Any], progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The measurement itself, in the producer process (the benchmark's environment)."""
    from lanes.redis_client import get_redis
    from tasks.dispatch import dispatch, dispatch_many
    from tools import probe
    from tools.benchmark import PLAIN_TYPE, _commandstats, _delta

    probe.install()
    n, rounds, warmup = int(spec["items"]), int(spec["rounds"]), int(spec["warmup"])
    say = progress or (lambda line: None)
    r = get_redis()

    def loop(count: int) -> int:
        return sum(1 for i in range(count) if not dispatch.delay(PLAIN_TYPE, {"n": i}).accepted)

    def many(count: int) -> int:
        with collector_paused():  # the benchmark's choice, never the library's (see collector_paused)
            results = dispatch_many(PLAIN_TYPE, [{"n": i} for i in range(count)])
        return sum(1 for result in results if not result.accepted)

    runs = {"loop": loop, "dispatch_many": many}
    for run in runs.values():
        run(warmup)
    measured: dict[str, list[dict[str, Any]]] = {mode: [] for mode in runs}
    for round_no in range(rounds):
        for mode in (list(runs) if round_no % 2 == 0 else list(reversed(runs))):
            by0, rt0, us0 = _commandstats(r), probe.snapshot().get("redis_round_trips", 0), _usec(r)
            t0, cpu0 = time.perf_counter(), time.process_time()
            rejected = runs[mode](n)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            rt = probe.snapshot().get("redis_round_trips", 0) - rt0
            us = _usec(r) - us0
            by = _delta(_commandstats(r), by0, {"info": 1})
            row = {"round": round_no + 1, "rate": round(n / elapsed, 1), "seconds": round(elapsed, 3),
                   "rejected": rejected, "redis_commands_per_item": round(sum(by.values()) / n, 2),
                   "redis_round_trips_per_item": round(rt / n, 4), "redis_us_per_item": round(us / n, 1),
                   "caller_cpu_us_per_item": round(cpu / n * 1e6, 1)}
            measured[mode].append(row)
            say(f"round {round_no + 1} {mode}: {row['rate']}/s")
    rows = []
    for mode, runs_of_mode in measured.items():
        rates = [m["rate"] for m in runs_of_mode]
        rows.append({"mode": mode, "description": MODES[mode], "median": statistics.median(rates),
                     "rates": rates, "redis_commands_per_item": runs_of_mode[-1]["redis_commands_per_item"],
                     "redis_round_trips_per_item": runs_of_mode[-1]["redis_round_trips_per_item"],
                     "redis_us_per_item": statistics.median(m["redis_us_per_item"] for m in runs_of_mode),
                     "caller_cpu_us_per_item": statistics.median(m["caller_cpu_us_per_item"] for m in runs_of_mode),
                     "rejected": sum(m["rejected"] for m in runs_of_mode)})
    loop_median = rows[0]["median"]
    for row in rows:
        row["ratio"] = round(row["median"] / loop_median, 2) if loop_median else None
    return {"items": n, "rounds": rounds, "rows": rows, "measurements": measured}


def _usec(r: Any) -> int:
    """Microseconds Redis spent running commands so far (``INFO commandstats``)."""
    return sum(int(v["usec"]) for v in r.info("commandstats").values())
