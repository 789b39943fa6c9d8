"""``manage.py backlog``: a paused lane filled with N waiting tasks, resumed, and drained once.

In its own Redis and scratch database (``tools.benchmark.Bench``), with real
workers serving two lanes:

1. the backlog lane is paused (``manage.py lanes --pause``);
2. a probe process dispatches to the other lane at a steady rate, first alone
   (the baseline), then while a fill process sends N tasks to the paused lane
   with ``dispatch_many``; admission latency p50/p99 of each phase;
3. during the fill, ``manage.py lanes --json`` and the dashboard page are timed (rendered in a
   process of their own, Django's start not counted),
   and Redis ``used_memory`` is read per chunk;
4. the lane is resumed (``manage.py lanes --resume``) and drained; each task's
   handler (``bench.mark``) sets its bit in a bitmap: every bit set and none
   set twice is "every task ran once".

Nothing here asserts a speed; the report is the figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

BACKLOG_TYPE, BACKLOG_LANE = "bench.backlog", "bench-backlog"
PROBE_TYPE, PROBE_LANE = "bench.probe", "bench-probe"
#: Items per ``dispatch_many`` call of the fill.
FILL_CHUNK = 5000


def config() -> dict[str, Any]:
    common = {"retry_policy": "bench", "priority": 5, "timeout": 86400, "attempt_timeout": 60, "chat_scoped": False,
              "options": {}}
    return {
        "lanes": [{"name": BACKLOG_LANE, "capacity": 10_000_000, "accepting": True},
                  {"name": PROBE_LANE, "capacity": 1_000_000, "accepting": True}],
        "task_types": [{"name": BACKLOG_TYPE, "handler": "bench.mark", "lane": BACKLOG_LANE, **common},
                       {"name": PROBE_TYPE, "handler": "bench.work", "lane": PROBE_LANE, **common}],
    }


def setup_config() -> None:
    import tools.bench_tasks  # noqa: F401 - registers bench.mark and bench.work
    from tasks.config_io import apply_config

    apply_config(config())


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def probe(rate: float, stop_file: str, ready_file: str = "", max_s: float = 3600.0) -> dict[str, Any]:
    """Dispatch to the probe lane at ``rate``/s until ``stop_file`` exists: admission latencies (ms).

    A first dispatch (the process's config load and connection, not admission's cost) is left out of the
    figures; ``ready_file`` is created after it, so the phase measured starts when the probe does.
    """
    from tasks.dispatch import dispatch

    dispatch.delay(PROBE_TYPE, {"n": -1})
    if ready_file:
        Path(ready_file).touch()
    latencies: list[float] = []
    rejected = 0
    start = time.perf_counter()
    stop = Path(stop_file)
    i = 0
    while not stop.exists() and time.perf_counter() - start < max_s:
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter()
        rejected += 0 if dispatch.delay(PROBE_TYPE, {"n": i}).accepted else 1
        latencies.append((time.perf_counter() - t0) * 1000)
        i += 1
    return {"dispatches": len(latencies), "rejected": rejected, "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99), "max_ms": percentile(latencies, 1.0)}


def fill(n: int, run: str, chunk: int = FILL_CHUNK, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Send ``n`` tasks of the backlog type with ``dispatch_many``; memory per chunk."""
    from lanes.redis_client import get_redis
    from tasks.bulk import dispatch_many

    say = progress or (lambda line: None)
    r = get_redis()
    before = int(r.info("memory")["used_memory"])
    rejected: dict[str, int] = {}
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        items = [{"run": run, "n": i} for i in range(start, min(n, start + chunk))]
        for result in dispatch_many(BACKLOG_TYPE, items):
            if not result.accepted:
                rejected[result.reason or "?"] = rejected.get(result.reason or "?", 0) + 1
        if (start // chunk) % 20 == 0:
            say(f"fill: {start + len(items)} of {n}, used_memory {int(r.info('memory')['used_memory']) >> 20} MiB")
    seconds = time.perf_counter() - t0
    after = int(r.info("memory")["used_memory"])
    return {"n": n, "seconds": round(seconds, 1), "rate": round(n / seconds, 1), "rejected": rejected,
            "used_memory_before": before, "used_memory_after": after,
            "bytes_per_task": round((after - before) / n, 1), "dbsize": r.dbsize()}


def time_views() -> dict[str, float]:
    """Seconds to render ``manage.py lanes --json`` and the dashboard page for a superuser, in this process."""
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    t0 = time.perf_counter()
    call_command("lanes", "--json", stdout=io.StringIO())
    lanes_s = time.perf_counter() - t0
    user_model = get_user_model()
    user = user_model.objects.filter(username="backlog-bench").first() or user_model.objects.create_superuser(
        "backlog-bench", "b@x", uuid.uuid4().hex)
    client = Client()
    client.force_login(user)
    t0 = time.perf_counter()
    page = client.get("/admin/dashboard/", HTTP_HOST="127.0.0.1")
    dashboard_s = time.perf_counter() - t0
    if page.status_code != 200:
        raise RuntimeError(f"the dashboard answered {page.status_code}")
    return {"lanes_s": round(lanes_s, 3), "dashboard_s": round(dashboard_s, 3)}


def run_backlog(*, n: int, probe_rate: float = 50.0, baseline_s: float = 10.0, instances: int = 2,
                concurrency: int = 8, drain_timeout_s: float = 7200.0, out: str | None = None,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The whole measurement (see the module docstring); returns the report.

    ``out``: a file the report so far is written to after each phase, so a run stopped early
    (or past ``drain_timeout_s``) keeps what it measured.
    """
    from lanes import keys
    from tools.bench_tasks import mark_key, twice_key
    from tools.benchmark import BIN, Bench, BenchOptions, _Proc, machine_info

    report: dict[str, Any] = {"n": n, "probe_rate": probe_rate, "machine": machine_info(),
                              "workers": f"{instances} x celery -P threads -c {concurrency}"}

    def say(line: str) -> None:
        (progress or (lambda _: None))(line)
        if out:
            Path(out).write_text(json.dumps(report, indent=1))

    bench = Bench(BenchOptions(workloads=["dispatch"]), progress=say)
    run = uuid.uuid4().hex[:8]
    workers: list[_Proc] = []
    try:
        bench.setup()
        bench._manage("backlog", "--role", "setup")
        r = bench.client
        logs = bench.tmp / "logs"
        logs.mkdir(exist_ok=True)
        for i in range(instances):
            workers.append(_Proc([str(BIN / "celery"), "-A", "dispatchsite", "worker", "-Q",
                                  f"{BACKLOG_LANE},{PROBE_LANE}", "-n", f"backlog{i}@%h", "-P", "threads", "-c",
                                  str(concurrency), "-l", "WARNING", "--without-gossip", "--without-mingle",
                                  "-I", "tools.bench_tasks"], bench.env, logs / f"worker-{i}.log"))
        bench._wait(lambda: all(r.zcard(keys.lane_consumers(lane)) >= instances
                                for lane in (BACKLOG_LANE, PROBE_LANE)), workers, "backlog")
        report["pause"] = bench._manage("lanes", "--pause", BACKLOG_LANE).strip()
        say("backlog: baseline probe")
        report["probe_baseline"] = _probe_phase(bench, probe_rate, lambda: time.sleep(baseline_s))
        say(f"backlog: fill {n} while probing")
        timings: dict[str, list[float]] = {"lanes_s": [], "dashboard_s": []}
        filled: dict[str, Any] = {}

        def do_fill() -> None:
            out = bench._manage("backlog", "--role", "fill", "--spec", json.dumps({"n": n, "run": run}),
                                timeout=drain_timeout_s)
            filled.update(json.loads(out.strip().splitlines()[-1]))

        def during() -> None:
            filler = threading.Thread(target=do_fill)
            filler.start()
            while filler.is_alive():
                for name, seconds in json.loads(bench._manage("backlog", "--role", "views")).items():
                    timings[name].append(seconds)
                filler.join(timeout=1)
            if not filled:
                raise RuntimeError("the fill failed (see the log above)")

        report["probe_during_fill"] = _probe_phase(bench, probe_rate, during)
        report["fill"] = filled
        report["views_during_fill"] = {k: {"calls": len(v), "max_s": max(v, default=None),
                                           "p50_s": percentile(v, 0.5)} for k, v in timings.items()}
        report["views_full"] = json.loads(bench._manage("backlog", "--role", "views"))
        report["used_memory_full"] = int(r.info("memory")["used_memory"])
        report["dbsize_full"] = r.dbsize()
        say("backlog: resume and drain")
        report["resume"] = bench._manage("lanes", "--resume", BACKLOG_LANE).strip()
        t0 = time.monotonic()
        deadline = t0 + drain_timeout_s
        accepted = n - sum(filled.get("rejected", {}).values())
        last_say = t0
        while r.bitcount(mark_key(run)) < accepted:
            if time.monotonic() > deadline:
                break
            if time.monotonic() - last_say > 60:
                last_say = time.monotonic()
                report["drain_so_far"] = {"seconds": round(last_say - t0), "ran": r.bitcount(mark_key(run)),
                                          "ran_twice": int(r.get(twice_key(run)) or 0)}
                say(f"backlog: drained {report['drain_so_far']['ran']} of {accepted}")
            if any(w.p.poll() is not None for w in workers):
                raise RuntimeError(f"a worker exited during the drain; see {logs}")
            time.sleep(1)
        drained_s = time.monotonic() - t0
        waiting = int(r.get(keys.lane_waiting(BACKLOG_LANE)) or 0)
        ran = r.bitcount(mark_key(run))
        report["drain"] = {"seconds": round(drained_s, 1), "rate": round(ran / drained_s, 1) if drained_s else None,
                           "ran": ran, "ran_twice": int(r.get(twice_key(run)) or 0), "accepted": accepted,
                           "complete": ran == accepted, "waiting_after": waiting}
        report["ok"] = (report["drain"]["ran"] == accepted and report["drain"]["ran_twice"] == 0)
        report["script_calls"] = {k: v for k, v in r.info("commandstats").items() if k in ("cmdstat_evalsha",
                                                                                            "cmdstat_rpop")}
        say("backlog: done")
    finally:
        for w in workers:
            w.stop()
        bench.teardown()
    return report


def _probe_phase(bench: Any, rate: float, body: Callable[[], None]) -> dict[str, Any]:
    """The probe in its own process while ``body`` runs; its latencies."""
    tag = uuid.uuid4().hex[:6]
    stop, ready = bench.tmp / f"probe-stop-{tag}", bench.tmp / f"probe-ready-{tag}"
    proc = subprocess.Popen([sys.executable, "manage.py", "backlog", "--role", "probe", "--spec",
                             json.dumps({"rate": rate, "stop_file": str(stop), "ready_file": str(ready)})],
                            cwd=str(Path(__file__).parent.parent),
                            env=bench.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Its Django start and first dispatch, before the measured phase (on a loaded host that outlasted
        # a fixed wait, and the baseline measured nothing).
        deadline = time.monotonic() + 300
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        body()
    finally:
        stop.touch()
        out, err = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"the probe failed: {err[-1500:]}")
    return json.loads(out.strip().splitlines()[-1])
