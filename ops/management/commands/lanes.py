"""``manage.py lanes``: the dashboard's lane table in a terminal, and the lane controls (--close, --pause, ...)."""

from __future__ import annotations

import sys
import time

from django.core.management.base import BaseCommand, CommandError

from ops import control, metrics
from tasks import commands, registry
from tasks.models import TaskType
from tasks.output import dumps, table
from tasks.shell_actor import shell_actor


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = ("Per lane: depth, in flight, rates, latency, failures, dead letters (the dashboard's table), "
            "then per limit: rate, in flight, waiting, throttled, busiest keys; "
            "or change a lane: --close/--open/--pause/--resume/--drain NAME.")

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the full snapshot as JSON")
        parser.add_argument("--watch", nargs="?", type=float, const=2.0, metavar="SECONDS",
                            help="refresh every SECONDS (default 2) until Ctrl-C")
        parser.add_argument("--lane", action="append", dest="only", metavar="NAME", help="show only these lanes")
        group = parser.add_mutually_exclusive_group()
        for action in control.ACTIONS:
            group.add_argument(f"--{action}", metavar="NAME", help=f"{action} the lane NAME")
        parser.add_argument("--timeout", type=float, help="--drain: give up after this many seconds")

    def handle(self, *args, **opts):
        actor = shell_actor()  # the OS user id, not $USER: the audit trail must not be spoofable
        for action in control.ACTIONS:
            if opts[action]:
                return self._control(action, opts[action], actor, opts)
        if opts["watch"]:
            try:
                while True:
                    text = self._render(opts)
                    self.stdout.write("\x1b[2J\x1b[H" + time.strftime("%H:%M:%S") + "  (Ctrl-C to stop)\n" + text)
                    self.stdout.flush()
                    time.sleep(max(0.5, opts["watch"]))
            except KeyboardInterrupt:
                return None
        self.stdout.write(self._render(opts))
        return None

    def _render(self, opts) -> str:
        snap = metrics.snapshot(lane_names=opts["only"])
        snap["batched_types"] = _batched_types(opts["only"])
        if opts["json"]:
            for lane in snap["lanes"]:
                lane.pop("series", None)
            return dumps(snap)
        lines = [table(metrics.table_rows(snap))]
        limit_rows = metrics.limit_table_rows(snap)
        if limit_rows:
            lines.append("\nlimits (admitted/s vs rate per key; in flight vs cap; busiest keys as running+waiting):")
            lines.append(table(limit_rows))
        if snap["batched_types"]:
            lines.append("\nbatched types (most tasks per handler call, window to fill a batch): " + ", ".join(
                f"{t['name']}@{t['lane']} {t['batch_size']}/{t['batch_window_ms']}ms" for t in snap["batched_types"]))
        chats = snap["chats"]
        lines.append(f"\nchats with a backlog: {chats['active']}, longest backlog: {chats['longest']}; "
                     f"dead letters pending: {snap['dead_letters_total']}")
        mem = snap["redis_memory"]
        room = "unknown" if mem["room_tasks"] is None else f"{mem['room_tasks']:,} tasks"
        lines.append(f"redis memory: {mem['used_human']} used, admission refuses at {mem['limit_human']} "
                     f"({mem['limited_by']}); room: {room} at {mem['bytes_per_task']:.0f} bytes a task")
        stuck = snap["stuck_threads"]
        if stuck["total"]:
            lines.append(f"threads stuck past their attempt's limit: {stuck['total']} ("
                         + ", ".join(f"{w} {n}" for w, n in stuck["by_worker"].items()) + ")")
        rejected = snap["rejections"]["by_reason_15m"]
        if rejected:
            lines.append("rejections, last 15 min: " + ", ".join(
                f"{r['reason']} {r['type']}@{r['lane'] or '-'}={r['count']}" for r in rejected[:8]))
        return "\n".join(lines)

    def _control(self, action: str, name: str, actor: str, opts) -> None:
        try:
            if action == "drain":
                outcome = control.drain(name, actor, timeout=opts["timeout"], progress=self._progress(name))
                self.stdout.write("")
            else:
                outcome = control.apply(action, name, actor)
        except control.ControlError as exc:
            raise CommandError(str(exc)) from None
        if opts["json"]:
            self.stdout.write(dumps({"lane": outcome.lane, "action": outcome.action, "message": outcome.message,
                                     "workers": outcome.workers}))
        else:
            self.stdout.write(outcome.message)

    def _progress(self, name: str):
        interactive = sys.stdout.isatty()

        def show(left: metrics.LaneGauges) -> None:
            line = (f"draining {name}: {left.remaining} left (depth {left.depth}, retries {left.scheduled_retries}, "
                    f"chat wait {left.chat_waiting}, running {left.in_flight})")
            if interactive:
                self.stdout.write("\r" + line.ljust(100), ending="")
            else:
                self.stdout.write(line)
            self.stdout.flush()

        return show


def _batched_types(only: list[str] | None) -> list[dict]:
    """Task types whose handler is batched, with their batch settings."""
    batched = [name for name in registry.handler_names() if registry.get(name).batch]
    rows = TaskType.objects.filter(handler__in=batched).select_related("lane").order_by("name")
    if only:
        rows = rows.filter(lane__name__in=only)
    return [{"name": t.name, "lane": t.lane.name, "handler": t.handler, "batch_size": t.batch_size,
             "batch_window_ms": t.batch_window_ms} for t in rows[:50]]
