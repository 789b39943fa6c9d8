from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand

from api.openapi import schema_text
from tasks import commands


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = "Write the HTTP API's OpenAPI schema (default docs/openapi.json; CI checks it matches the served one)."

    def add_arguments(self, parser):
        parser.add_argument("--output", default=str(Path("docs") / "openapi.json"), help="a file, or - for stdout")

    def handle(self, *args, **opts):
        text = schema_text()
        if opts["output"] == "-":
            self.stdout.write(text, ending="")
            return
        Path(opts["output"]).write_text(text, encoding="utf-8")
        paths = sorted(json.loads(text)["paths"])
        self.stdout.write(f"wrote {opts['output']}: {', '.join(paths)}")
