"""``manage.py capacity``: the Redis cores and memory a load needs, from the measured costs (lanes.capacity)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from lanes import capacity
from tasks import commands
from tasks.output import dumps, table


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = ("Print the Redis cores and memory that --rate tasks/s with up to --backlog waiting tasks need on a path "
            "(plain, chat, limited, batched, bulk), from the measured costs in lanes/capacity.py (docs/scaling.md).")

    def add_arguments(self, parser):
        parser.add_argument("--rate", type=float, required=True, help="tasks/s, dispatch to finish")
        parser.add_argument("--backlog", type=int, required=True, help="most tasks waiting at once")
        parser.add_argument("--path", default="plain", choices=list(capacity.PATHS))
        parser.add_argument("--high", type=float, default=capacity.MEMORY_HIGH_DEFAULT,
                            help="the memory guard's share of maxmemory (DISPATCH_MEMORY_HIGH)")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        try:
            plan = capacity.plan(opts["rate"], opts["backlog"], opts["path"], opts["high"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        cost = capacity.cost(plan.path)
        row = {
            "path": plan.path, "rate": plan.rate, "backlog": plan.backlog,
            "redis_cpu_us_per_task": cost.redis_cpu_us, "commands_per_task": cost.commands,
            "bytes_per_waiting_task": cost.bytes_waiting, "redis_cores": round(plan.cores, 2),
            "deployments": plan.deployments, "memory_gib": round(plan.memory_gib, 2),
            "maxmemory_gib": round(plan.maxmemory_gib, 2),
            "per_core_tasks_s": round(capacity.tasks_per_core(plan.path)),
            "per_gib_backlog": capacity.backlog_per_gib(plan.path),
        }
        if opts["json"]:
            self.stdout.write(dumps(row))
            return
        self.stdout.write(table([row], ["path", "rate", "backlog", "redis_cores", "deployments", "memory_gib",
                                        "maxmemory_gib"]))
        self.stdout.write(
            f"\n{plan.path}: {cost.redis_cpu_us:.0f} µs of Redis CPU and {cost.commands} commands a task, "
            f"{cost.bytes_waiting:.0f} bytes a waiting task; one Redis core carries "
            f"{row['per_core_tasks_s']:,} tasks/s at {capacity.CORE_TARGET:.0%} busy, one GiB "
            f"{row['per_gib_backlog']:,} waiting tasks.")
        if plan.deployments > 1:
            self.stdout.write(f"More than one Redis core: split the lanes across {plan.deployments} deployments "
                              "(docs/scaling.md, 'Past one Redis'), or use a batched type / dispatch_many.")
        self.stdout.write(f"Set maxmemory to at least {plan.maxmemory_gib:.2f} GiB: admission refuses past "
                          f"{opts['high']:.0%} of it (redis_memory_high).")
