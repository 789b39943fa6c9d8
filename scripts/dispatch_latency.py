"""Single-dispatch latency: N sequential ``dispatch.delay`` calls against a real redis-server, each timed.

    .venv/bin/python scripts/dispatch_latency.py [--calls 2000] [--rounds 3] [ROOT ...]

Each ROOT is a checkout (default: this one); the rounds alternate between them
(A B A B ...), each round a fresh process with its own redis-server
(``appendfsync no``: the caller's and the script's cost, not the disk's) and
SQLite file, so two checkouts are compared in the same run. A live consumer is
registered for the lane, as a serving lane has one. Prints per round, in
microseconds a call: p50, p99 and mean of the wall time, the caller's CPU
(``process_time``), Redis' time in commands and its commands (``INFO commandstats``): on a
busy machine the wall times are noisy, the two CPU figures much less. Then the
median and the least of the rounds per checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _redis_usec(client) -> tuple[int, int]:
    """Microseconds Redis spent in commands so far and the commands (``INFO commandstats``), its own INFO's
    included."""
    stats = client.info("commandstats").values()
    return sum(int(stat["usec"]) for stat in stats), sum(int(stat["calls"]) for stat in stats)


def measure(root: Path, calls: int, warmup: int) -> dict[str, float]:
    """One round in this process, importing the code of ``root``."""
    sys.path.insert(0, str(root))
    os.chdir(root)
    from tests.support.redis_server import RedisServer

    tmp = Path(tempfile.mkdtemp(prefix="dispatch-latency-"))
    server = RedisServer(tmp / "redis", secrets.token_urlsafe(12), appendfsync="no").start()
    try:
        os.environ.update({
            "DJANGO_SETTINGS_MODULE": "dispatchsite.settings", "REDIS_URL": server.url,
            "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}", "DISPATCH_SECRETS_FILE": str(tmp / "secrets.json"),
            "DISPATCH_RUNTIME_FILE": str(tmp / "runtime.json"),
        })
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        from lanes import keys
        from tasks.dispatch import dispatch
        from tests.support.helpers import define

        define("latency.echo", lane="latency", capacity=10_000_000)
        server.client().zadd(keys.lane_consumers("latency"), {"bench@host": int((time.time() + 3600) * 1000)})
        for i in range(warmup):
            assert dispatch.delay("latency.echo", {"warm": i}).accepted
        took: list[float] = []
        clock = time.perf_counter
        client = server.client()
        redis_us = _redis_usec(client)
        cpu = time.process_time()
        for i in range(calls):
            started = clock()
            result = dispatch.delay("latency.echo", {"i": i})
            took.append(clock() - started)
            assert result.accepted, result
        cpu = time.process_time() - cpu
        redis_us, commands = (after - before for after, before in zip(_redis_usec(client), redis_us, strict=True))
        took.sort()
        return {"p50_us": took[len(took) // 2] * 1e6, "p99_us": took[int(len(took) * 0.99)] * 1e6,
                "mean_us": statistics.fmean(took) * 1e6, "caller_cpu_us": cpu / calls * 1e6,
                "redis_us": redis_us / calls, "redis_commands": commands / calls}
    finally:
        server.stop()


def _shown(figures: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" if k == "redis_commands" else f"{k} {v:.0f}" for k, v in figures.items())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("roots", nargs="*", type=Path)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.one:
        print(json.dumps(measure(opts.one, opts.calls, opts.warmup)))
        return
    roots = [root.resolve() for root in opts.roots] or [HERE]
    rounds: dict[Path, list[dict[str, float]]] = {root: [] for root in roots}
    for number in range(opts.rounds):
        for root in roots:
            out = subprocess.run([sys.executable, __file__, "--one", str(root), "--calls", str(opts.calls),
                                  "--warmup", str(opts.warmup)], check=True, capture_output=True, text=True)
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            rounds[root].append(figures)
            print(f"round {number + 1} {root}: " + _shown(figures))
    for root, figures in rounds.items():
        medians = {k: statistics.median(f[k] for f in figures) for k in figures[0]}
        least = {k: min(f[k] for f in figures) for k in figures[0]}
        print(f"median of {len(figures)} rounds {root}: " + _shown(medians))
        print(f"least of {len(figures)} rounds {root}: " + _shown(least))


if __name__ == "__main__":
    main()
