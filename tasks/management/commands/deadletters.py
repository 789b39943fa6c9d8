from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from lanes.models import Lane
from tasks import commands, dead_letters
from tasks.models import DeadLetter, TaskType
from tasks.output import dumps, table
from tasks.reasons import DEAD_REASONS
from tasks.shell_actor import shell_actor


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = "List dead letters, or requeue / discard one by id or task id."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--requeue", metavar="ID")
        parser.add_argument("--discard", metavar="ID")
        parser.add_argument("--type", dest="task_type", help="a task type's name")
        parser.add_argument("--reason", choices=DEAD_REASONS)
        parser.add_argument("--lane", help="a lane's name")
        parser.add_argument("--status", default="dead", choices=[*DeadLetter.Status.values, "all"])
        parser.add_argument("--limit", type=int, default=50)

    def _row(self, ident: str) -> DeadLetter:
        query = DeadLetter.objects.filter(task_id=ident)
        if ident.isdigit():
            query = DeadLetter.objects.filter(pk=int(ident)) | query
        row = query.first()
        if row is None:
            raise CommandError(f"no dead letter with id or task id {ident!r}")
        return row

    def handle(self, *args, **opts):
        actor = shell_actor()
        try:
            if opts["requeue"]:
                new_id = dead_letters.requeue(self._row(opts["requeue"]), actor)
                self.stdout.write(dumps({"requeued": opts["requeue"], "task_id": new_id}))
                return
            if opts["discard"]:
                dead_letters.discard(self._row(opts["discard"]), actor)
                self.stdout.write(dumps({"discarded": opts["discard"]}))
                return
        except dead_letters.RequeueError as exc:
            raise CommandError(str(exc)) from None
        _check_known("--type", opts["task_type"], TaskType.objects.values_list("name", flat=True),
                     DeadLetter.objects.values_list("task_type", flat=True))
        _check_known("--lane", opts["lane"], Lane.objects.values_list("name", flat=True),
                     DeadLetter.objects.values_list("lane", flat=True))
        query = DeadLetter.objects.all()
        if opts["status"] != "all":
            query = query.filter(status=opts["status"])
        for field, key in (("task_type", "task_type"), ("reason", "reason"), ("lane", "lane")):
            if opts[key]:
                query = query.filter(**{field: opts[key]})
        rows = [
            {"id": r.pk, "task_id": r.task_id, "type": r.task_type, "lane": r.lane, "chat": r.chat_id,
             "reason": r.reason, "attempts": r.attempts, "status": r.status,
             "died_at": r.died_at.isoformat(timespec="seconds"), "error": r.error_message[:80]}
            for r in query[: opts["limit"]]
        ]
        self.stdout.write(dumps(rows) if opts["json"] else table(rows))


def _check_known(option: str, value: str | None, *sources) -> None:
    """A filter value nothing could match is a usage error (exit 2) naming the values that exist."""
    if not value:
        return
    known = sorted({name for source in sources for name in source.distinct() if name})
    if value not in known:
        shown = ", ".join(known[:30]) + (f", ... ({len(known)} in all)" if len(known) > 30 else "")
        raise CommandError(f"{option} {value!r} matches no known value; known: {shown or '(none)'}", returncode=2)
