"""``manage.py smsload``: the SMS demo stepped, every message accounted for (seed 004; see tools/smsload.py)."""

from __future__ import annotations

import argparse
import json
import sys

from django.core.management.base import BaseCommand, CommandError

from tasks.output import HelpFormatter, dumps, table
from tools import smsload

_DEFAULTS = smsload.SmsLoadOptions()


def _steps(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CommandError(f"--steps must be comma-separated integers, not {text!r}") from None
    if not values or min(values) <= 0:
        raise CommandError("--steps needs at least one positive rate")
    return values


class Command(BaseCommand):
    help = (
        "Seed 004's acceptance on this machine: the SMS demo (sms.submit batched, sms.submit_one unbatched) "
        "stepped through --steps msg/s, each for --step-seconds. Starts its own Redis (or --redis-url), the "
        "simulated supplier and the workers; uses DATABASE_URL (a scratch SQLite file when unset), where it "
        "creates the bench.sms and bench.sms_one types. A step passes when, during the step, rows are written "
        "at >= 97% of the offered rate, the backlog at its end is under one second of offered load, it drains "
        "within --drain-limit, and every message is accounted for: one SmsMessage row per accepted message "
        "(or a dead letter), none twice, none unknown, and the supplier's count of the step's messages equal to "
        "the rows. Exit 0 when every step passes, 1 when a step fails, 3 when a message was lost, duplicated or "
        "unknown."
    )

    def create_parser(self, prog_name, subcommand, **kwargs):
        return super().create_parser(prog_name, subcommand, formatter_class=HelpFormatter, **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("--mode", choices=["batched", "single", "both"], default="batched",
                            help="sms.submit (batched), sms.submit_one (one message per task), or both in turn "
                                 "with the same steps, side by side")
        parser.add_argument("--steps", default=",".join(map(str, _DEFAULTS.steps)), help="rates in msg/s")
        parser.add_argument("--step-seconds", type=float, default=_DEFAULTS.step_seconds)
        parser.add_argument("--instances", type=int, default=_DEFAULTS.instances,
                            help="worker processes (Celery main processes) per mode")
        parser.add_argument("--pool", default=_DEFAULTS.pool, help="the workers' Celery pool")
        parser.add_argument("--concurrency", type=int, default=_DEFAULTS.concurrency, help="per worker process")
        parser.add_argument("--senders", type=int, default=_DEFAULTS.senders, help="generator threads")
        parser.add_argument("--channels", type=int, default=_DEFAULTS.channels,
                            help="supplier channels the messages spread over")
        parser.add_argument("--supplier-tps", type=float, default=_DEFAULTS.supplier_tps,
                            help="messages/s each supplier channel accepts")
        parser.add_argument("--supplier-latency-ms", type=float, default=_DEFAULTS.supplier_latency_ms,
                            help="milliseconds each supplier request takes")
        parser.add_argument("--drain-limit", type=float, default=_DEFAULTS.drain_limit_s,
                            help="seconds after a step's end within which every message must have its row")
        parser.add_argument("--settle", type=float, default=_DEFAULTS.settle_s,
                            help="extra seconds to wait for a late step before accounting for it")
        parser.add_argument("--keep-going", action="store_true", help="run a mode's later steps after a failed one")
        parser.add_argument("--drop-rows-every", type=int, default=0, metavar="N",
                            help="delete 1 in N of each step's rows before the check (proves the check fails)")
        parser.add_argument("--redis-url", help="a scratch Redis to use instead of starting one (it is FLUSHDB'd)")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--role", choices=["drive"], help=argparse.SUPPRESS)
        parser.add_argument("--spec", help=argparse.SUPPRESS)

    def handle(self, *args, **opts):
        if opts["role"] == "drive":
            self.stdout.write(json.dumps(smsload.drive(json.loads(opts["spec"]), self._progress)))
            return
        for name in ("instances", "concurrency", "senders", "channels"):
            if opts[name] < 1:
                raise CommandError(f"--{name} must be 1 or more")
        if opts["drop_rows_every"] < 0:
            raise CommandError("--drop-rows-every must be 0 or more")
        options = smsload.SmsLoadOptions(
            steps=_steps(opts["steps"]), step_seconds=opts["step_seconds"],
            modes=list(smsload.MODES) if opts["mode"] == "both" else [opts["mode"]],
            instances=opts["instances"], pool=opts["pool"], concurrency=opts["concurrency"],
            senders=opts["senders"], channels=opts["channels"], supplier_tps=opts["supplier_tps"],
            supplier_latency_ms=opts["supplier_latency_ms"], drain_limit_s=opts["drain_limit"],
            settle_s=opts["settle"], stop_on_fail=not opts["keep_going"], drop_rows_every=opts["drop_rows_every"],
            redis_url=opts["redis_url"], database_url=smsload.default_database_url(),
        )
        report = smsload.SmsLoad(options, self._progress).run()
        if opts["json"]:
            self.stdout.write(dumps(report.as_dict()))
        else:
            self.stdout.write(table(smsload.table_rows(report), smsload.TABLE_COLUMNS))
            both = smsload.side_by_side(report)
            if both:
                self.stdout.write(table(both, smsload.SIDE_BY_SIDE_COLUMNS))
            self.stdout.write(smsload.summary(report))
        if report.exit_code:
            raise SystemExit(report.exit_code)

    def _progress(self, line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
