from __future__ import annotations

import json

from celery.exceptions import TimeoutError as CeleryTimeoutError
from django.core.management.base import BaseCommand, CommandError

from tasks.dispatch import admit
from tasks.output import HelpFormatter, dumps

#: Exit codes a script can branch on (also in ``--help`` and the README).
EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_FAILED, EXIT_WAIT_TIMEOUT, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4, 5
EXIT_CODES_HELP = """\
exit codes:
  0  accepted (with --wait: the task succeeded)
  1  rejected: the printed "reason" says why (unknown_type, lane_full, ...)
  2  usage error: bad option or JSON (the message names the argument)
  3  --wait: the task failed for good (dead letter; "error" names the reason)
  4  --wait: no outcome within --wait-timeout (the task may still run)
  5  unavailable: Redis unreachable; retry with the same --idempotency-key
"""


class Command(BaseCommand):
    help = "Dispatch one task and print its DispatchResult as JSON (--wait also waits for the outcome)."

    def create_parser(self, prog_name, subcommand, **kwargs):
        return super().create_parser(prog_name, subcommand, formatter_class=HelpFormatter, epilog=EXIT_CODES_HELP,
                                     **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("task_type")
        parser.add_argument("--payload", default="{}", help="JSON object")
        parser.add_argument("--chat", dest="chat_id")
        parser.add_argument("--priority", type=int)
        parser.add_argument("--idempotency-key")
        parser.add_argument("--timeout", type=float)
        parser.add_argument("--metadata", help="JSON object")
        parser.add_argument("--countdown", type=float, help="send later: seconds from now")
        parser.add_argument("--eta", help="send later: ISO 8601 time with an offset")
        parser.add_argument("--retry-policy", help="a retry policy's name (instead of the type's)")
        parser.add_argument("--wait", action="store_true", help="wait for the task's outcome")
        parser.add_argument("--wait-timeout", type=float, default=60.0, help="seconds --wait waits")

    def handle(self, *args, **opts):
        payload = _json_arg("--payload", opts["payload"])
        metadata = _json_arg("--metadata", opts["metadata"]) if opts["metadata"] else None
        result = admit(
            opts["task_type"], payload, chat_id=opts["chat_id"], priority=opts["priority"],
            idempotency_key=opts["idempotency_key"], timeout=opts["timeout"], metadata=metadata,
            countdown=opts["countdown"], eta=opts["eta"], retry_policy=opts["retry_policy"],
        )
        out = result.as_dict()
        code = EXIT_OK
        if not result.accepted:
            code = EXIT_UNAVAILABLE if result.reason == "unavailable" else EXIT_REJECTED
        elif opts["wait"]:
            async_result = result.async_result()
            try:
                outcome = result.get(timeout=opts["wait_timeout"], propagate=False)
            except CeleryTimeoutError as exc:
                out["result"] = None
                out["wait_error"] = f"TimeoutError: {exc}"
                code = EXIT_WAIT_TIMEOUT
            else:
                if async_result.successful():
                    out["result"] = outcome
                else:
                    out["result"] = None
                    out["error"] = f"{type(outcome).__name__}: {outcome}"
                    code = EXIT_FAILED
            out["state"] = async_result.state
        self.stdout.write(dumps(out))
        if code:
            raise SystemExit(code)


def _json_arg(name: str, text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{name} is not valid JSON: {exc}", returncode=EXIT_USAGE) from None
