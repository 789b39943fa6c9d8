"""``manage.py cancel TASK_ID [--in-chat ID] | --chat ID | --key TYPE KEY | --lane NAME --queued``: cancel what
is no longer wanted.

Exit codes a script can trust: 0 the cancel took effect (cancelled, running
task told, or already cancelled: a cancel is idempotent); 1 nothing to cancel
(unknown task, or it already finished); 2 usage (bad arguments, or a lane purge
not confirmed); 3 Redis did not answer (nothing known: run it again).
"""

from __future__ import annotations

import sys

import redis
from django.core.management.base import BaseCommand, CommandError

from lanes.models import Lane
from ops import control
from tasks import cancel as cancelling
from tasks import commands
from tasks.output import dumps, table
from tasks.shell_actor import shell_actor

#: Outcomes after which the task will not run (again): exit 0.
TOOK_EFFECT = {"cancelled", "running_told", "already_cancelled"}


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = ("Cancel a task by id, everything queued for a chat (--chat), the task an idempotency key names "
            "(--key TYPE KEY), or every task waiting in a lane (--lane NAME --queued, typed confirmation or --yes). "
            "Exit 0: took effect; 1: nothing to cancel; 2: usage; 3: Redis did not answer.")

    def add_arguments(self, parser):
        parser.add_argument("task_id", nargs="?", help="the task to cancel")
        parser.add_argument("--chat", metavar="ID", help="cancel everything queued for this chat")
        parser.add_argument("--in-chat", metavar="ID", help="with TASK_ID: the task's chat, if known (found in "
                            "one step; without it a chat task is searched for among every live task)")
        parser.add_argument("--key", nargs=2, metavar=("TYPE", "KEY"), help="the task this idempotency key names")
        parser.add_argument("--lane", metavar="NAME", help="with --queued: cancel every task waiting in this lane")
        parser.add_argument("--queued", action="store_true", help="with --lane: what waits (running tasks stay)")
        parser.add_argument("--yes", action="store_true", help="--lane: skip the typed confirmation (scripts)")
        parser.add_argument("--reason", default="", help="why (kept in the REVOKED result with your user name)")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        doors = [bool(opts["task_id"]), bool(opts["chat"]), bool(opts["key"]), bool(opts["lane"])]
        if sum(doors) != 1:
            raise CommandError("give exactly one of TASK_ID, --chat ID, --key TYPE KEY, --lane NAME --queued",
                               returncode=2)
        if opts["in_chat"] and not opts["task_id"]:
            raise CommandError("--in-chat ID goes with a TASK_ID (the task's chat)", returncode=2)
        by = shell_actor()  # the OS user id: the audit trail must not be spoofable
        if opts["lane"]:
            return self._purge(opts["lane"], opts, by)
        if opts["chat"]:
            found = cancelling.cancel_chat(opts["chat"], opts["reason"], by=by)
        elif opts["key"]:
            found = [cancelling.cancel_key(*opts["key"], opts["reason"], by=by)]
        else:
            found = [cancelling.cancel_task(opts["task_id"], opts["reason"], by=by, chat_id=opts["in_chat"])]
        rows = [r.as_dict() for r in found]
        self.stdout.write(dumps(rows) if opts["json"] else (table(rows) if rows else "nothing queued"))
        outcomes = {r.outcome for r in found}
        if "invalid" in outcomes:
            raise CommandError(next(r.detail for r in found if r.outcome == "invalid"), returncode=2)
        if "unavailable" in outcomes:
            raise CommandError("Redis did not answer: nothing known, run it again", returncode=3)
        if not found or not outcomes & TOOK_EFFECT:
            raise CommandError("nothing to cancel", returncode=1)
        return None

    def _purge(self, lane: str, opts, by: str) -> None:
        if not opts["queued"]:
            raise CommandError("--lane needs --queued (a purge cancels what waits; running tasks stay)", returncode=2)
        found = Lane.objects.filter(name=lane).first()
        if found is None:
            raise CommandError(f"no lane named {lane!r}", returncode=2)
        if not opts["yes"]:
            if not sys.stdin.isatty():
                raise CommandError("a lane purge asks to type the lane's name; give --yes in scripts", returncode=2)
            if found.accepting:
                self.stdout.write(f"lane {lane} still accepts tasks: one dispatched during the purge may stay. "
                                  f"Close it first (manage.py lanes --close {lane}) for a clean cut.")
            typed = input(f"Every task waiting in lane {lane} will be cancelled. Type the lane's name to confirm: ")
            if typed.strip() != lane:
                raise CommandError("not confirmed: nothing was cancelled", returncode=2)
        try:
            summary = cancelling.purge_lane(lane, opts["reason"] or "lane purge", by=by)
        except redis.RedisError as exc:  # Redis away: honest exit, some batches may have run
            raise CommandError(f"purge stopped: {exc}", returncode=3) from None
        control.log(lane, "purge", by, f"cancelled {summary.cancelled} waiting task(s): {summary.counts}")
        if opts["json"]:
            self.stdout.write(dumps({"lane": lane, "counts": summary.counts}))
        else:
            self.stdout.write(f"lane {lane}: {summary.cancelled} waiting task(s) cancelled")
