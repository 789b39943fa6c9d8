from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from lanes.config_version import ConfigVersionNotPublished
from tasks import commands
from tasks.config_io import apply_config
from tasks.errors import ConfigError


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = "Upsert lanes, retry policies and task types from a JSON file, all or nothing."

    def add_arguments(self, parser):
        parser.add_argument("file")

    def handle(self, *args, **opts):
        try:
            with open(opts["file"], encoding="utf-8") as fh:
                data = json.load(fh)
        except OSError as exc:
            raise CommandError(f"cannot read {opts['file']}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise CommandError(f"{opts['file']} is not valid JSON: {exc}") from None
        try:
            counts = apply_config(data)
        except ConfigError as exc:
            raise CommandError(f"{opts['file']}: {exc} (nothing was changed)") from None
        except ConfigVersionNotPublished as exc:
            raise CommandError(f"{opts['file']}: {exc}") from None
        self.stdout.write(", ".join(f"{n} {section}" for section, n in counts.items()) + " applied")
