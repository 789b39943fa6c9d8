from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from tasks.dispatch import admit
from tasks.output import dumps


class Command(BaseCommand):
    help = "Dispatch one task and print its DispatchResult as JSON (--wait also waits for the outcome)."

    def add_arguments(self, parser):
        parser.add_argument("task_type")
        parser.add_argument("--payload", default="{}", help="JSON object")
        parser.add_argument("--chat", dest="chat_id")
        parser.add_argument("--priority", type=int)
        parser.add_argument("--idempotency-key")
        parser.add_argument("--timeout", type=float)
        parser.add_argument("--metadata", help="JSON object")
        parser.add_argument("--wait", action="store_true", help="wait for the task's result")
        parser.add_argument("--wait-timeout", type=float, default=60.0)

    def handle(self, *args, **opts):
        try:
            payload = json.loads(opts["payload"])
            metadata = json.loads(opts["metadata"]) if opts["metadata"] else None
        except json.JSONDecodeError as exc:
            raise CommandError(f"--payload/--metadata is not valid JSON: {exc}") from None
        result = admit(
            opts["task_type"], payload, chat_id=opts["chat_id"], priority=opts["priority"],
            idempotency_key=opts["idempotency_key"], timeout=opts["timeout"], metadata=metadata,
        )
        out = result.as_dict()
        if opts["wait"] and result.accepted:
            async_result = result.async_result()
            try:
                out["result"] = result.get(timeout=opts["wait_timeout"], propagate=False)
            except Exception as exc:  # noqa: BLE001 - report the wait failure, keep the result printed
                out["result"] = None
                out["wait_error"] = f"{type(exc).__name__}: {exc}"
            out["state"] = async_result.state
        self.stdout.write(dumps(out))
        if not result.accepted:
            raise SystemExit(1)
