"""``manage.py smsload``: the SMS demo stepped, every message accounted for (seed 004; see tools/smsload.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from django.core.management.base import BaseCommand, CommandError

from tasks import commands
from tasks.output import HelpFormatter, dumps, table
from tools import smsload
from tools.management.commands.loadtest import int_list

_DEFAULTS = smsload.SmsLoadOptions()


#: The numeric options: flag, field (of SmsLoadOptions, else of its BenchOptions), type, help.
NUMBERS = [
    ("--step-seconds", "step_seconds", float, "how long each step lasts"),
    ("--instances", "instances", int, "worker processes (Celery main processes) per mode"),
    ("--concurrency", "io_concurrency", int, "pool size of each worker process"),
    ("--senders", "senders", int, "generator threads (0: per step, enough for 100 ms of its rate in flight)"),
    ("--channels", "sms_channels", int, "supplier channels the messages spread over"),
    ("--supplier-tps", "sms_tps", float, "messages/s each supplier channel accepts"),
    ("--supplier-latency-ms", "sms_latency_ms", float, "milliseconds each supplier request takes"),
    ("--drain-limit", "drain_limit_s", float, "seconds after a step's end within which every message has its row"),
    ("--settle", "settle_s", float, "extra seconds to wait for a late step before accounting for it"),
    ("--drop-rows-every", "drop_rows_every", int, "delete 1 in N of each step's rows before the check (proves the "
                                                  "check fails; 0: never)"),
]
_OWN = {f.name for f in dataclasses.fields(smsload.SmsLoadOptions)}


def _default(dest: str):
    return getattr(_DEFAULTS if dest in _OWN else _DEFAULTS.bench, dest)


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = (
        "Seed 004's acceptance: the SMS demo stepped through --steps msg/s (sms.submit batched, sms.submit_one "
        "unbatched, or both side by side), on DATABASE_URL (a scratch SQLite file when unset), with its own Redis, "
        "supplier and workers; a step passes by the load test's rule with every message accounted for (one "
        "SmsMessage row each, the supplier agreeing). Exit 0 all passed, 1 a step failed, 3 a message lost, "
        "duplicated or unknown. See tools/smsload.py."
    )

    def add_arguments(self, parser):
        parser.formatter_class = HelpFormatter  # defaults shown in --help
        parser.add_argument("--mode", choices=["batched", "single", "both"], default="batched",
                            help="sms.submit (batched), sms.submit_one (one message per task), or both in turn "
                                 "with the same steps, side by side")
        parser.add_argument("--steps", default=",".join(map(str, _DEFAULTS.steps)), help="rates in msg/s")
        for flag, dest, kind, text in NUMBERS:
            parser.add_argument(flag, dest=dest, type=kind, default=_default(dest), help=text,
                                metavar="N" if kind is int else "X")
        parser.add_argument("--pool", dest="io_pool", default=_DEFAULTS.bench.io_pool, help="the workers' Celery pool")
        parser.add_argument("--keep-going", action="store_true", help="run a mode's later steps after a failed one")
        parser.add_argument("--redis-url", help="a scratch Redis to use instead of starting one (it is FLUSHDB'd)")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--show", metavar="FILE.json", help="print the tables of a report saved with --json")
        parser.add_argument("--role", choices=["drive"], help=argparse.SUPPRESS)
        parser.add_argument("--spec", help=argparse.SUPPRESS)

    def handle(self, *args, **opts):
        if opts["role"] == "drive":
            self.stdout.write(json.dumps(smsload.drive(json.loads(opts["spec"]), self._progress)))
            return
        if opts["show"]:
            with open(opts["show"]) as fh:
                self._print(smsload.SmsLoadReport.from_dict(json.load(fh)))
            return
        for flag, dest, _, _ in NUMBERS:
            zero_ok = dest in ("drop_rows_every", "senders")
            if opts[dest] < (0 if zero_ok else 1e-9):
                raise CommandError(f"{flag} must be {'0 or more' if zero_ok else 'positive'}")
        options = smsload.SmsLoadOptions(
            steps=int_list(opts["steps"]), modes=list(smsload.MODES) if opts["mode"] == "both" else [opts["mode"]],
            stop_on_fail=not opts["keep_going"], **{dest: opts[dest] for _, dest, _, _ in NUMBERS if dest in _OWN})
        bench = options.bench
        bench.io_pool, bench.redis_url, bench.database_url = opts["io_pool"], opts["redis_url"], \
            smsload.default_database_url()
        for _, dest, _, _ in NUMBERS:
            if dest not in _OWN:
                setattr(bench, dest, opts[dest])
        report = smsload.SmsLoad(options, self._progress).run()
        if opts["json"]:
            self.stdout.write(dumps(report.as_dict()))
        else:
            self._print(report)
        if report.exit_code:
            raise SystemExit(report.exit_code)

    def _print(self, report: smsload.SmsLoadReport) -> None:
        self.stdout.write(table(smsload.table_rows(report), smsload.TABLE_COLUMNS))
        both = smsload.side_by_side(report)
        if both:
            self.stdout.write(table(both, smsload.SIDE_BY_SIDE_COLUMNS))
        self.stdout.write(smsload.summary(report))

    def _progress(self, line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
