from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from api.models import ServiceToken
from tasks import commands
from tasks.output import dumps


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = ("Service tokens of the HTTP API: 'create NAME --type T [--type T ...]' prints the token once; "
            "'revoke NAME'; 'list'. [--retry-policy P ...] [--reads-broker-tasks] [--lane-share PCT]")

    def add_arguments(self, parser):
        parser.add_argument("action", choices=("create", "revoke", "list"))
        parser.add_argument("name", nargs="?")
        parser.add_argument("--type", dest="types", action="append", default=[], help="an allowed task type")
        parser.add_argument("--rate", type=int, help="tasks (a bulk counts each item) and reads per second "
                                                     "(default DISPATCH_API_RATE_PER_S)")
        parser.add_argument("--retry-policy", dest="policies", action="append", default=[],
                            help="a retry policy its dispatches may name (none: only the type's own)")
        parser.add_argument("--reads-broker-tasks", action="store_true",
                            help="also read tasks sent by name through the broker (tasks.dispatch)")
        parser.add_argument("--lane-share", type=int, default=100,
                            help="per cent (1-100) of each lane's capacity its tasks may hold (default 100)")
        parser.add_argument("--notes", default="")

    def handle(self, *args, **opts):
        action, name = opts["action"], opts["name"]
        if action == "list":
            rows = [{"name": t.name, "prefix": t.prefix, "types": sorted(x.name for x in t.task_types.all()),
                     "rate_per_s": t.rate_per_s, "lane_share": t.lane_share, "revoked": t.revoked}
                    for t in ServiceToken.objects.prefetch_related("task_types")]
            self.stdout.write(dumps(rows))
            return
        if not name:
            raise CommandError(f"'{action}' needs a token name")
        if action == "revoke":
            token = ServiceToken.objects.filter(name=name).first()
            if token is None:
                raise CommandError(f"no service token named {name!r}")
            token.revoke()
            self.stdout.write(f"revoked {name}")
            return
        if ServiceToken.objects.filter(name=name).exists():
            raise CommandError(f"a service token named {name!r} exists; revoke it or pick another name")
        try:
            _, clear = ServiceToken.objects.issue(name, opts["types"], rate_per_s=opts["rate"], notes=opts["notes"],
                                                  retry_policies=opts["policies"],
                                                  reads_broker_tasks=opts["reads_broker_tasks"],
                                                  lane_share=opts["lane_share"])
        except ValidationError as exc:
            raise CommandError("; ".join(f"{field}: {' '.join(errors)}"
                                         for field, errors in exc.message_dict.items())) from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(clear)
