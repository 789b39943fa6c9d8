"""What the metrics and lifecycle signals cost: no-op tasks end to end, with and without them, same run.

Variants, interleaved round by round (A B C, then B C A, ...) on a private
redis-server and SQLite file:

- ``on``: the platform as shipped (Lua counters; signals with no receiver on
  the accepted path);
- ``off``: the Lua counting helpers turned into no-ops and no signal sent
  (``tests.support.metrics_off``, in the producer and the worker);
- ``on+receivers``: as shipped, plus a do-nothing receiver on every signal
  (``tests.support.noop_receivers``): what a subscriber adds.

One run: a worker (prefork, as ``make run`` starts it) is started and warmed up,
then this process dispatches N no-op tasks as fast as it can while the worker
runs them; throughput = N / (first dispatch .. lane empty and no lease left).
Also reported: Redis commands per task (INFO commandstats, Lua's inner calls
included; background polling adds to it in proportion to the run's length) and
the metric commands alone (HINCRBY, HINCRBYFLOAT, EXPIRE) per task.

Usage: ``.venv/bin/python scripts/measure_overhead.py [--tasks 4000] [--rounds 3]
[--concurrency 2] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = {
    "on": "",
    "off": "tests.support.metrics_off",
    "on+receivers": "tests.support.noop_receivers",
}
LANE, TYPE = "ovh", "ovh.noop"


#: The commands the metrics use (inside the scripts); nothing else on the task path issues them.
METRIC_COMMANDS = ("hincrby", "hincrbyfloat", "expire")


def _commands(client) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client.info("commandstats").items()
            if k.startswith("cmdstat_")}


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of processes so far (from /proc; 0 for one that is gone)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _drained(client) -> bool:
    from lanes import keys

    pipe = client.pipeline(transaction=False)
    for queue in keys.lane_queues(LANE):
        pipe.llen(queue)
    pipe.zcard(keys.LEASES)
    return not any(pipe.execute())


def _set_variant(name: str) -> None:
    """Apply the variant in this process too (the producer side: admission and task_queued)."""
    from tests.support import metrics_off, noop_receivers

    metrics_off.disable()
    noop_receivers.disconnect()
    if name == "off":
        metrics_off.enable()
    elif name == "on+receivers":
        noop_receivers.connect()


def run_once(variant: str, n: int, concurrency: int, logs: Path, client, redis_pid: int) -> dict:
    from tasks.dispatch import dispatch
    from tests.support.workers import Worker

    _set_variant(variant)
    env = {"DISPATCH_HOOK_MODULES": VARIANTS[variant]} if VARIANTS[variant] else {}
    worker = Worker(LANE, logs, concurrency=concurrency, env=env).start()
    try:
        warm = [dispatch.delay(TYPE, {}) for _ in range(100)]
        assert all(r.accepted for r in warm)
        deadline = time.monotonic() + 120
        while not _drained(client):
            if time.monotonic() > deadline:
                raise RuntimeError("warm-up did not drain")
            time.sleep(0.05)
        commands_before = _commands(client)
        pids = [worker.pid, *worker.children(), redis_pid]
        cpu_before, own_before = _cpu_s(pids), time.process_time()
        t0 = time.perf_counter()
        for _ in range(n):
            if not dispatch.delay(TYPE, {}).accepted:
                raise RuntimeError("a dispatch was refused")
        dispatched = time.perf_counter()
        while not _drained(client):
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        cpu = _cpu_s(pids) - cpu_before + time.process_time() - own_before
        after = _commands(client)
        commands = sum(after.values()) - sum(commands_before.values())
        metric_commands = sum(after.get(c, 0) - commands_before.get(c, 0) for c in METRIC_COMMANDS)
    finally:
        worker.stop(timeout=30)
    return {"variant": variant, "tasks": n, "seconds": round(elapsed, 3), "tasks_per_s": round(n / elapsed, 1),
            "dispatch_s": round(dispatched - t0, 3), "redis_commands_per_task": round(commands / n, 2),
            "metric_commands_per_task": round(metric_commands / n, 2), "cpu_ms_per_task": round(cpu * 1000 / n, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()

    from tests.support.redis_server import RedisServer

    tmp = Path(tempfile.mkdtemp(prefix="dispatch-overhead-"))
    server = RedisServer(tmp / "redis", secrets.token_urlsafe(12), appendfsync="everysec").start()
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "dispatchsite.settings", "REDIS_URL": server.url,
        "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}", "DISPATCH_SECRETS_FILE": str(tmp / "secrets.json"),
        "CELERY_WORKER_SEND_TASK_EVENTS": "false", "LOG_LEVEL": "WARNING",
    })
    try:
        import django

        django.setup()
        from django.core.management import call_command

        from tests.support.helpers import define

        call_command("migrate", interactive=False, verbosity=0)
        define(TYPE, handler="demo.echo", lane=LANE, capacity=1_000_000)
        client = server.client()
        names = list(VARIANTS)
        results = []
        for round_no in range(opts.rounds):
            order = names[round_no % len(names):] + names[:round_no % len(names)]
            for variant in order:
                result = run_once(variant, opts.tasks, opts.concurrency, tmp / "logs", client, server.proc.pid)
                result["round"] = round_no + 1
                results.append(result)
                if not opts.json:
                    print(json.dumps(result), flush=True)
        summary = {}
        for variant in names:
            rates = [r["tasks_per_s"] for r in results if r["variant"] == variant]
            cmds = [r["redis_commands_per_task"] for r in results if r["variant"] == variant]
            metric_cmds = [r["metric_commands_per_task"] for r in results if r["variant"] == variant]
            cpu = [r["cpu_ms_per_task"] for r in results if r["variant"] == variant]
            # Paired with the "off" run of the same round: contention from outside hits both alike.
            ratios = [r["tasks_per_s"] / off["tasks_per_s"] for r in results if r["variant"] == variant
                      for off in results if off["variant"] == "off" and off["round"] == r["round"]]
            summary[variant] = {"median_tasks_per_s": statistics.median(rates), "runs": rates,
                                "median_throughput_vs_off_same_round_pct": round(
                                    (statistics.median(ratios) - 1) * 100, 1),
                                "median_cpu_ms_per_task": statistics.median(cpu),
                                "redis_commands_per_task": statistics.median(cmds),
                                "metric_commands_per_task": statistics.median(metric_cmds)}
        base_cpu = summary["off"]["median_cpu_ms_per_task"]
        for variant in names:
            summary[variant]["cpu_vs_off_pct"] = round(
                (summary[variant]["median_cpu_ms_per_task"] / base_cpu - 1) * 100, 1)
        print(json.dumps({"summary": summary, "runs": results} if opts.json else {"summary": summary}, indent=2))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
