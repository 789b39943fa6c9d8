from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from tasks import dead_letters
from tasks.models import DeadLetter
from tasks.output import dumps, table
from tasks.shell_actor import shell_actor


class Command(BaseCommand):
    help = "List dead letters, or requeue / discard one by id or task id."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--requeue", metavar="ID")
        parser.add_argument("--discard", metavar="ID")
        parser.add_argument("--type", dest="task_type")
        parser.add_argument("--reason")
        parser.add_argument("--lane")
        parser.add_argument("--status", default="dead", help="dead | requeued | discarded | all")
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
