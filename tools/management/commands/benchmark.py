"""``manage.py benchmark``: the platform side by side with plain Celery, Dramatiq, Huey and taskiq (see
tools/benchmark.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from tasks import commands
from tasks.output import dumps, table
from tools import benchmark


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = (
        "Side-by-side benchmark on this machine: dispatch-only calls/s and end-to-end tasks/s (no-op and 20 ms "
        "I/O) of plain Celery, the platform's plain and chat-scoped types, and Dramatiq, Huey and taskiq at their "
        "own defaults (needs `pip install -r requirements-bench.txt`, or `make bench`); with --workloads latency, "
        "enqueue->start p50/p99 idle and at half the plain path's no-op capacity. Starts its own Redis, scratch "
        "database and workers; alternates the systems over --rounds and prints medians and ratios to plain "
        "Celery and to the fastest peer."
    )

    def add_arguments(self, parser):
        parser.add_argument("--quick", action="store_true", help="one small round of everything (CI)")
        parser.add_argument("--rounds", type=int)
        parser.add_argument("--tasks", type=int, help="tasks per end-to-end measurement")
        parser.add_argument("--dispatch-tasks", type=int, help="calls per dispatch-only measurement")
        parser.add_argument("--warmup", type=int)
        parser.add_argument("--chats", type=int, default=1000)
        parser.add_argument("--io-ms", type=float, default=20.0)
        parser.add_argument("--instances", type=int, default=2, help="worker instances (main processes) per system")
        parser.add_argument("--pool", default="prefork", help="Celery pool for the no-op workload")
        parser.add_argument("--concurrency", type=int, default=1, help="per instance, no-op workload")
        parser.add_argument("--io-pool", default="threads", help="Celery pool for the I/O workload")
        parser.add_argument("--io-concurrency", type=int, default=16, help="per instance, I/O workload")
        parser.add_argument("--systems", default=",".join(benchmark.DEFAULT_SYSTEMS),
                            help=f"of {','.join(benchmark.SYSTEMS)}")
        parser.add_argument("--tracing", action="store_true",
                            help="also run the platform's plain path with OpenTelemetry on (system platform-traced), "
                                 "beside it with tracing off")
        parser.add_argument("--workloads", default=",".join(benchmark.DEFAULT_WORKLOADS),
                            help=f"of {','.join(benchmark.WORKLOADS)} (sms and latency only when named)")
        parser.add_argument("--latency-idle", type=int, help="latency workload: tasks sent one at a time (200)")
        parser.add_argument("--latency-gap-ms", type=float, help="latency workload: ms after each idle send (10)")
        parser.add_argument("--latency-load-s", type=float, help="latency workload: seconds of the loaded phase (3)")
        parser.add_argument("--latency-rate", type=float,
                            help="latency workload: tasks/s of the loaded phase (default: half the plain no-op rate)")
        parser.add_argument("--redis-url", help="a scratch Redis to use instead of starting one (it is FLUSHDB'd)")
        parser.add_argument("--profile", metavar="DIR", help="py-spy record producer and workers in round 1")
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--json-file", metavar="FILE.json",
                            help="also write the report as JSON to FILE.json (the tables are still printed)")
        parser.add_argument("--role", choices=["setup", "produce"], help=argparse.SUPPRESS)
        parser.add_argument("--spec", help=argparse.SUPPRESS)

    def handle(self, *args, **opts):
        if opts["role"] == "setup":
            # The scratch database migrated here, in the process that fills it: one start less a run.
            call_command("migrate", interactive=False, verbosity=0)
            benchmark.setup_config()
            return
        if opts["role"] == "produce":
            self.stdout.write(json.dumps(benchmark.produce(json.loads(opts["spec"]))))
            return
        systems = [s for s in opts["systems"].split(",") if s]
        if opts["tracing"]:
            for traced, plain in benchmark.TRACED_SYSTEMS.items():
                systems += [name for name in (plain, traced) if name not in systems]
        workloads = [w for w in opts["workloads"].split(",") if w]
        for name, given, known in (("system", systems, benchmark.SYSTEMS), ("workload", workloads,
                                                                               benchmark.WORKLOADS)):
            unknown = sorted(set(given) - set(known))
            if unknown:
                raise CommandError(f"unknown {name}(s) {unknown}; choose from {', '.join(known)}")
        base = benchmark.BenchOptions.quick() if opts["quick"] else benchmark.BenchOptions()
        fields = {
            "rounds": opts["rounds"], "n_noop": opts["tasks"], "n_io": opts["tasks"], "n_sms": opts["tasks"],
            "n_dispatch": opts["dispatch_tasks"], "warmup": opts["warmup"],
        }
        for key, value in fields.items():
            if value is not None:
                setattr(base, key, max(1, value))
        for key, value, low in (("latency_idle_n", opts["latency_idle"], 1),
                                ("latency_gap_ms", opts["latency_gap_ms"], 0.0),
                                ("latency_load_s", opts["latency_load_s"], 0.01),
                                ("latency_rate", opts["latency_rate"], 0.01)):
            if value is not None:
                if value < low:
                    raise CommandError(f"--{key.replace('_n', '').replace('_', '-')} must be at least {low}")
                setattr(base, key, value)
        base.chats, base.io_ms = max(1, opts["chats"]), opts["io_ms"]
        base.instances, base.pool, base.concurrency = max(1, opts["instances"]), opts["pool"], opts["concurrency"]
        base.io_pool, base.io_concurrency = opts["io_pool"], opts["io_concurrency"]
        base.systems, base.workloads = systems, workloads
        base.redis_url, base.profile_dir = opts["redis_url"], opts["profile"]

        def progress(line: str) -> None:
            self.stderr.write(line)

        report = benchmark.Bench(base, progress).run()
        if opts["json_file"]:
            Path(opts["json_file"]).write_text(dumps(report.as_dict()))
        if opts["json"]:
            self.stdout.write(dumps(report.as_dict()))
            return
        main = benchmark.table_rows(report)
        if main or not benchmark.latency_table_rows(report):
            self.stdout.write(table(main, benchmark.TABLE_COLUMNS))
        for line in benchmark.command_breakdown(report):
            self.stdout.write(line)
        latency = benchmark.latency_table_rows(report)
        if latency:
            self.stdout.write("\nenqueue->start (ms; n = starts recorded/tasks sent):")
            self.stdout.write(table(latency, benchmark.LATENCY_COLUMNS))
        m = report.machine
        self.stdout.write(
            f"{m.get('cpus')} CPUs ({m.get('cpu')}), Python {m.get('python')}, Redis {m.get('redis_server')}, "
            f"celery {m.get('celery')}, dramatiq {m.get('dramatiq') or 'not installed'}, "
            f"huey {m.get('huey') or 'not installed'}, taskiq {m.get('taskiq') or 'not installed'} "
            f"(taskiq-redis {m.get('taskiq-redis') or 'not installed'}); "
            f"{base.rounds} round(s), {report.seconds}s"
        )
