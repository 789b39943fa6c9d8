"""``manage.py limitbench``: a limit's delivered rate and fair-share shares on a running platform (tools.limitbench)."""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from tasks import commands
from tasks.output import dumps
from tools.limitbench import run_limitbench


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = ("Against the running workers: a global limit's applied rate when demand exceeds it, and a fair-share "
            "limit's completion shares per key vs its weights (tasks of the loadtest.sink handler).")

    def add_arguments(self, parser):
        parser.add_argument("--lane", default="realtime", help="a lane the running workers consume")
        parser.add_argument("--rate", type=float, default=100.0, help="the global limit's rate (tasks/s)")
        parser.add_argument("--burst", type=int, default=10)
        parser.add_argument("--seconds", type=float, default=20.0, help="demand: rate x seconds + burst tasks at once")
        parser.add_argument("--latency-ms", type=float, default=20.0, help="the sink's simulated I/O per task")
        parser.add_argument("--fair-window", type=int, default=8)
        parser.add_argument("--fair-weights", default='{"big": 3, "small": 1}',
                            help='JSON key -> weight; a key "plain" of weight 1 is added')
        parser.add_argument("--fair-per-key", type=int, default=300)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        try:
            weights = json.loads(opts["fair_weights"])
        except ValueError as exc:
            raise CommandError(f"--fair-weights must be a JSON object of key -> weight: {exc}") from None
        report = run_limitbench(
            lane=opts["lane"], rate=opts["rate"], burst=opts["burst"], seconds=opts["seconds"],
            latency_ms=opts["latency_ms"], fair_window=opts["fair_window"], fair_weights=weights,
            fair_per_key=opts["fair_per_key"], progress=lambda line: print(line, file=sys.stderr))
        data = report.as_dict()
        if opts["json"]:
            self.stdout.write(dumps(data))
            return
        r = data["rate"]
        self.stdout.write(f"rate: limit {r['rate']}/s (burst {r['burst']}), {r['tasks']} tasks at once: "
                          f"{r['applied_per_s']}/s applied after the burst = {r['share_of_limit']} of the limit")
        for key, s in data["fair"]["shares"].items():
            self.stdout.write(f"fair share (window {data['fair']['window']}): {key}: {s['completions']} completions, "
                              f"share {s['share']} (weight share {s['expected']})")
