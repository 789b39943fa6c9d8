"""``manage.py bulkbench``: items/s of ``dispatch_many`` against a loop of ``dispatch.delay`` (tools.bulkbench)."""

from __future__ import annotations

import argparse
import json
import sys

from django.core.management.base import BaseCommand, CommandError

from tasks import commands
from tasks.output import dumps, table
from tools.bulkbench import produce_bulk, run_bulkbench


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = ("Dispatch N items of a plain type as a loop of dispatch.delay and as dispatch_many, side by side in one "
            "run (own Redis and scratch database, nobody consuming); prints items/s medians and the ratio.")

    def add_arguments(self, parser):
        parser.add_argument("--items", type=int, default=5000, help="items per measurement")
        parser.add_argument("--rounds", type=int, default=3, help="rounds (the order alternates); medians of them")
        parser.add_argument("--warmup", type=int, default=200)
        parser.add_argument("--redis-url", help="an existing Redis to use (it is FLUSHED); default: start one")
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--role", choices=["produce"], help=argparse.SUPPRESS)
        parser.add_argument("--spec", help=argparse.SUPPRESS)

    def handle(self, *args, **opts):
        if opts["role"] == "produce":
            report = produce_bulk(json.loads(opts["spec"]), progress=lambda line: print(line, file=sys.stderr))
            self.stdout.write(json.dumps(report))
            return
        if opts["items"] < 1 or opts["rounds"] < 1:
            raise CommandError("--items and --rounds must be at least 1")
        report = run_bulkbench(items=opts["items"], rounds=opts["rounds"], warmup=opts["warmup"],
                               redis_url=opts["redis_url"], progress=lambda line: print(line, file=sys.stderr))
        if opts["json"]:
            self.stdout.write(dumps(report))
            return
        columns = ["mode", "median", "ratio", "rates", "caller_cpu_us_per_item", "redis_us_per_item",
                   "redis_commands_per_item", "redis_round_trips_per_item", "rejected"]
        self.stdout.write(table([{**row, "rates": ", ".join(f"{r:.0f}" for r in row["rates"])}
                                 for row in report["rows"]], columns))
        self.stdout.write(f"{report['items']} items x {report['rounds']} rounds, medians in items/s; ratio = "
                          "median / the loop's")
