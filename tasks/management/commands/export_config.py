from __future__ import annotations

from django.core.management.base import BaseCommand

from tasks import commands
from tasks.config_io import export_config
from tasks.output import dumps


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = "Print lanes, retry policies and task types in the apply_config format."

    def add_arguments(self, parser):
        parser.add_argument("--output", "-o", help="write to this file instead of stdout")

    def handle(self, *args, **opts):
        text = dumps(export_config()) + "\n"
        if opts["output"]:
            with open(opts["output"], "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            self.stdout.write(text, ending="")
