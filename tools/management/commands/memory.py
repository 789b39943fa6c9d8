"""``manage.py memory``: bytes per waiting task, in total and by part, beside the peers (tools.memory)."""

from __future__ import annotations

import argparse
import json

from django.core.management.base import BaseCommand, CommandError

from tasks import commands
from tasks.output import dumps, table
from tools import memory


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = ("Fill a fresh Redis per system with N waiting tasks (nobody consuming) and print bytes per task: "
            "INFO used_memory after - before, and the platform's by part (MEMORY USAGE of every key it added).")

    def add_arguments(self, parser):
        parser.add_argument("--tasks", type=int, default=20_000, help="tasks per system")
        parser.add_argument("--kinds", default=",".join(memory.KINDS), help=f"of {','.join(memory.KINDS)}")
        parser.add_argument("--peers", default=",".join(memory.PEERS),
                            help=f"of {','.join(memory.PEERS)} ('' for none)")
        parser.add_argument("--stock-redis", action="store_true",
                            help="Redis's defaults, not the platform's settings (lanes.capacity.REDIS_CONFIG)")
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--role", choices=["setup", "fill"], help=argparse.SUPPRESS)
        parser.add_argument("--spec", help=argparse.SUPPRESS)

    def handle(self, *args, **opts):
        if opts["role"] == "setup":
            memory.setup_config()
            return
        if opts["role"] == "fill":
            spec = json.loads(opts["spec"])
            self.stdout.write(json.dumps(memory.fill(spec["kind"], int(spec["n"]))))
            return
        kinds = [k for k in opts["kinds"].split(",") if k]
        peers = [p for p in opts["peers"].split(",") if p]
        for name, given, known in (("kind", kinds, memory.KINDS), ("peer", peers, memory.PEERS)):
            unknown = sorted(set(given) - set(known))
            if unknown:
                raise CommandError(f"unknown {name}(s) {unknown}; choose from {', '.join(known)}")
        if opts["tasks"] < 100:
            raise CommandError("--tasks must be at least 100 (fewer measure the allocator, not the tasks)")
        report = memory.run_memory(n=opts["tasks"], kinds=kinds, peers=peers, stock=opts["stock_redis"],
                                   progress=lambda line: self.stderr.write(line))
        if opts["json"]:
            self.stdout.write(dumps(report))
            return
        rows = []
        for row in report["rows"]:
            shown = {"system": row["system"], "bytes/task": row.get("bytes_per_task", row.get("error", ""))}
            for part, value in row.get("parts", {}).items():
                if value:
                    shown[part] = value
            if "unattributed" in row:
                shown["unattributed"] = row["unattributed"]
            rows.append(shown)
        columns = ["system", "bytes/task", *[p for p in memory.PARTS if any(p in r for r in rows)], "unattributed"]
        self.stdout.write(table(rows, columns))
        config = "Redis defaults" if opts["stock_redis"] else "the platform's Redis settings"
        self.stdout.write(f"{report['n']} tasks per system, each in a fresh redis-server ({config}), nobody consuming")
