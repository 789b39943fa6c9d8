"""``manage.py loadtest``: the verified stepped load test (see tools/loadtest.py)."""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from tasks import commands
from tasks.output import HelpFormatter, dumps, table
from tools import loadtest

_DEFAULTS = loadtest.LoadTestOptions()


def int_list(text: str) -> list[int]:
    """``--steps``: comma-separated positive rates (``manage.py smsload`` reads its own the same way)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CommandError(f"--steps must be comma-separated integers, not {text!r}") from None
    if not values or min(values) <= 0:
        raise CommandError("--steps needs at least one positive rate")
    return values


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = (
        "Stepped, open-loop load test of a running platform with verification: per step offered/accepted/"
        "completed rates, dispatch and end-to-end latency, drain time, lost/duplicate/out-of-order effects and "
        "per-task Redis and SQL costs. A step passes only when, during the step, completions reach 97% of the "
        "offered rate and the backlog at its end is under one second of offered load, it drains within "
        "--drain-limit after, and nothing was lost, duplicated or reordered; 'sustained' is the highest passing "
        "step, 'knee' the lowest step whose queue depth grew. --batched drives a batched chat-scoped type "
        "(loadtest.sink_batch: one simulated I/O wait per batch) and reports tasks per handler call; --bulk N sends "
        "with dispatch_many; --limit-key-count K spreads the messages over K limit keys. Exit 0 when every step "
        "passes, 1 when a step fails (or Ctrl-C), 3 when anything was lost, duplicated or reordered."
    )

    def create_parser(self, prog_name, subcommand, **kwargs):
        return super().create_parser(prog_name, subcommand, formatter_class=HelpFormatter, **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("--steps", default=",".join(map(str, _DEFAULTS.steps)),
                            help="rates in tasks/s, comma-separated (the defaults suit `make run`'s workers)")
        parser.add_argument("--step-seconds", type=float, default=_DEFAULTS.step_seconds,
                            help="how long each step lasts")
        parser.add_argument("--chats", type=int, default=_DEFAULTS.chats,
                            help="distinct chats the messages spread over")
        parser.add_argument("--latency-ms", type=float, default=_DEFAULTS.latency_ms,
                            help="simulated outbound I/O per message")
        parser.add_argument("--fail-rate", type=float, default=_DEFAULTS.fail_rate,
                            help="fraction of attempts that fail retryably")
        parser.add_argument("--type", dest="type_name", default=None,
                            help="a chat-scoped task type whose handler is loadtest.sink or loadtest.sink_batch "
                                 f"(default: {loadtest.SINK_HANDLER}, or {loadtest.BATCHED_TYPE} with --batched)")
        parser.add_argument("--batched", action="store_true",
                            help=f"drive a batched chat-scoped type of the {loadtest.BATCH_SINK_HANDLER} handler "
                                 "(one --latency-ms wait per batch, each item recorded, failing at --fail-rate on "
                                 "its own): --type's if it exists (its batch shape set from --batch-size and "
                                 "--batch-window-ms), else created on --lane")
        parser.add_argument("--batch-size", type=int, default=loadtest.DEFAULT_BATCH_SIZE,
                            help="with --batched: most tasks per handler call (1..1000)")
        parser.add_argument("--batch-window-ms", type=int, default=loadtest.DEFAULT_BATCH_WINDOW_MS,
                            help="with --batched: how long a worker waits to fill a batch (0..1000)")
        parser.add_argument("--lane", default="realtime", help="with --batched: the lane of a type it creates")
        parser.add_argument("--bulk", type=int, default=0, metavar="N",
                            help="send with dispatch_many, each sender's chunk holding the messages due when it "
                                 "goes (up to N); 0: one dispatch per message")
        parser.add_argument("--limit-key-count", type=int, default=0, metavar="K",
                            help="each chat's messages carry one of K limit keys (lt-key-0..K-1); the type must "
                                 "have a key-scoped limit, and a type that has one needs this")
        parser.add_argument("--drain-limit", type=float, default=10.0,
                            help="seconds after a step's end within which its queue must drain")
        parser.add_argument("--settle", type=float, default=60.0,
                            help="extra seconds to wait for a late step before verifying it")
        parser.add_argument("--senders", type=int, default=0,
                            help="generator threads (each owns a set of chats); 0: per step, enough for 100 ms "
                                 "of its rate in flight (at least 4, at most --chats)")
        parser.add_argument("--drop-every", type=int, default=0,
                            help="make the sink drop 1 in N applied messages (proves the checker fails)")
        parser.add_argument("--keep-going", action="store_true", help="run later steps after a failed one")
        parser.add_argument("--probe-dir", help="directory where workers started with -I tools.probe write counts")
        parser.add_argument("--seed", type=int)
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--plot", metavar="FILE.png", help="write a PNG plot of the steps")

    def handle(self, *args, **opts):
        type_name = opts["type_name"] or (loadtest.BATCHED_TYPE if opts["batched"] else loadtest.SINK_HANDLER)
        if opts["bulk"] < 0 or opts["limit_key_count"] < 0:
            raise CommandError("--bulk and --limit-key-count must be 0 or more")
        if opts["batched"]:
            try:
                loadtest.ensure_batched_type(type_name, lane=opts["lane"], batch_size=opts["batch_size"],
                                             batch_window_ms=opts["batch_window_ms"])
            except loadtest.LoadTestError as exc:
                raise CommandError(str(exc)) from None
        options = loadtest.LoadTestOptions(
            steps=int_list(opts["steps"]), step_seconds=opts["step_seconds"], chats=max(1, opts["chats"]),
            latency_ms=opts["latency_ms"], fail_rate=opts["fail_rate"], type_name=type_name,
            drain_limit_s=opts["drain_limit"], settle_s=opts["settle"], senders=max(0, opts["senders"]),
            drop_every=max(0, opts["drop_every"]), stop_on_fail=not opts["keep_going"],
            probe_dir=opts["probe_dir"], seed=opts["seed"], bulk=opts["bulk"],
            limit_key_count=opts["limit_key_count"],
        )
        stop = threading.Event()

        def on_interrupt(signum, frame):
            if stop.is_set():
                raise KeyboardInterrupt
            stop.set()
            self.stderr.write("\ninterrupted: finishing the current step's verification (Ctrl-C again to abort)")

        previous = signal.signal(signal.SIGINT, on_interrupt) if threading.current_thread() is threading.main_thread() \
            else None
        try:
            test = loadtest.LoadTest(options, loadtest.stderr_progress(self.stderr._out), stop)
            report = test.run()
        except loadtest.LoadTestError as exc:
            raise CommandError(str(exc)) from None
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if opts["plot"] and report.steps:
            loadtest.plot(report, opts["plot"])
        if opts["json"]:
            self.stdout.write(dumps(report.as_dict()))
        else:
            self.stdout.write(table(loadtest.table_rows(report), loadtest.table_columns(report)))
            self.stdout.write(
                f"run {report.run}  type {report.type}  lane {report.lane}  "
                f"sustained rate: {report.sustained_rate or 0}/s  "
                f"knee: {f'{report.knee_rate}/s' if report.knee_rate else 'none (depth never grew)'}"
                + ("  (interrupted)" if report.interrupted else "")
                + (f"  plot: {opts['plot']}" if opts["plot"] and report.steps else "")
            )
            if any(not s.passed and not s.interrupted for s in report.steps):
                self.stdout.write(loadtest.WORKER_HINT)
        if report.exit_code:
            raise SystemExit(report.exit_code)
