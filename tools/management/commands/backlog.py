"""``manage.py backlog``: a paused lane filled with N waiting tasks, resumed, drained once (tools.backlog)."""

from __future__ import annotations

import argparse
import json
import sys

from django.core.management.base import BaseCommand, CommandError

from tasks import commands
from tasks.output import dumps
from tools import backlog


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = ("In its own Redis and scratch database: pause a lane, fill it with --tasks waiting tasks (dispatch_many) "
            "while another lane's admission latency is probed and the dashboard and `manage.py lanes` are timed, "
            "then resume and drain it, checking that every task ran once. Prints the report as JSON.")

    def add_arguments(self, parser):
        parser.add_argument("--tasks", type=int, default=1_000_000)
        parser.add_argument("--probe-rate", type=float, default=50.0, help="dispatches/s to the other lane")
        parser.add_argument("--instances", type=int, default=2, help="worker main processes")
        parser.add_argument("--concurrency", type=int, default=8, help="threads per worker")
        parser.add_argument("--drain-timeout", type=float, default=7200.0, help="seconds")
        parser.add_argument("--out", help="write the report so far to this file after each phase")
        parser.add_argument("--role", choices=["setup", "fill", "probe", "views"], help=argparse.SUPPRESS)
        parser.add_argument("--spec", help=argparse.SUPPRESS)

    def handle(self, *args, **opts):
        role = opts["role"]
        if role == "setup":
            backlog.setup_config()
            return
        if role == "fill":
            spec = json.loads(opts["spec"])
            report = backlog.fill(int(spec["n"]), spec["run"], progress=lambda line: print(line, file=sys.stderr))
            self.stdout.write(json.dumps(report))
            return
        if role == "probe":
            spec = json.loads(opts["spec"])
            report = backlog.probe(float(spec["rate"]), spec["stop_file"], spec.get("ready_file", ""))
            self.stdout.write(json.dumps(report))
            return
        if role == "views":
            self.stdout.write(json.dumps(backlog.time_views()))
            return
        if opts["tasks"] < 1 or opts["probe_rate"] <= 0:
            raise CommandError("--tasks must be at least 1 and --probe-rate above 0")
        report = backlog.run_backlog(n=opts["tasks"], probe_rate=opts["probe_rate"], instances=opts["instances"],
                                     concurrency=opts["concurrency"], drain_timeout_s=opts["drain_timeout"],
                                     out=opts["out"], progress=lambda line: self.stderr.write(line))
        self.stdout.write(dumps(report))
        drain = report.get("drain", {})
        if drain.get("ran_twice"):
            raise CommandError(f"{drain['ran_twice']} tasks ran twice (see drain)")
        if not drain.get("complete"):
            raise CommandError(f"the drain stopped at --drain-timeout: {drain.get('ran')} of {drain.get('accepted')} "
                               "ran, none twice (see drain)")
