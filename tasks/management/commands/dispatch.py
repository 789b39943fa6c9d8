from __future__ import annotations

import json
import sys
import uuid

from celery.exceptions import TimeoutError as CeleryTimeoutError
from django.core.management.base import BaseCommand, CommandError

from lanes import records
from lanes.redis_client import get_redis
from tasks import bulk, commands, owners
from tasks.bulk_file import dispatch_lines
from tasks.dispatch import admit
from tasks.output import HelpFormatter, dumps

#: Exit codes a script can branch on (also in ``--help`` and the README).
EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_FAILED, EXIT_WAIT_TIMEOUT, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4, 5
EXIT_CODES_HELP = """\
--payloads-file FILE.jsonl dispatches one task per non-blank line: a payload
object, or {"payload": {...}, "options": {...}} (keys exactly "payload" and
"options"; options as dispatch.delay takes them: chat_id, priority,
idempotency_key, timeout, metadata, limit_key). --chat, --priority, --timeout
and --metadata are every line's defaults. It prints a summary (accepted,
rejected by reason, unavailable, the first rejections with their line numbers)
and, with --results FILE, one JSON result per line.

exit codes:
  0  accepted (with --wait: the task succeeded; with --payloads-file: every line)
  1  rejected: the printed "reason" says why (unknown_type, lane_full, ...);
     with --payloads-file: some line was rejected
  2  usage error: bad option or JSON (the message names the argument)
  3  --wait: the task failed for good (dead letter; "error" names the reason)
  4  --wait: no outcome within --wait-timeout (the task may still run; "state"
     and "record_state" say where it was: queued, running, retry, ...)
  5  unavailable: Redis unreachable; retry with the same --idempotency-key
     (with --payloads-file: some line; retry the file, with idempotency keys)
"""


class Command(BaseCommand):
    requires_system_checks = commands.CHECKS
    help = "Dispatch one task and print its DispatchResult as JSON (--wait also waits for the outcome)."

    def create_parser(self, prog_name, subcommand, **kwargs):
        return super().create_parser(prog_name, subcommand, formatter_class=HelpFormatter, epilog=EXIT_CODES_HELP,
                                     **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("task_type")
        parser.add_argument("--payload", default=None, help="JSON object (default {})")
        parser.add_argument("--payloads-file", metavar="FILE.jsonl",
                            help="dispatch one task per line (see below); - reads standard input")
        parser.add_argument("--results", metavar="FILE", help="--payloads-file: write each line's result here (JSONL)")
        parser.add_argument("--chat", dest="chat_id")
        parser.add_argument("--priority", type=int)
        parser.add_argument("--idempotency-key")
        parser.add_argument("--timeout", type=float)
        parser.add_argument("--limit-key", help="the key of the type's key-scoped limit (e.g. a supplier's name)")
        parser.add_argument("--metadata", help="JSON object")
        parser.add_argument("--countdown", type=float, help="send later: seconds from now")
        parser.add_argument("--eta", help="send later: ISO 8601 time with an offset")
        parser.add_argument("--retry-policy", help="a retry policy's name (instead of the type's)")
        parser.add_argument("--dedupe-key", help="the key a throttled or debounced type goes by (else the "
                                                 "idempotency key)")
        parser.add_argument("--wait", action="store_true", help="wait for the task's outcome")
        parser.add_argument("--wait-timeout", type=float, default=60.0, help="seconds --wait waits")

    def handle(self, *args, **opts):
        metadata = _json_arg("--metadata", opts["metadata"]) if opts["metadata"] else None
        if opts["payloads_file"]:
            self._dispatch_file(opts, metadata)
            return
        if opts["results"]:
            raise CommandError("--results goes with --payloads-file", returncode=EXIT_USAGE)
        payload = _json_arg("--payload", opts["payload"] or "{}")
        result = admit(
            opts["task_type"], payload, chat_id=opts["chat_id"], priority=opts["priority"],
            idempotency_key=opts["idempotency_key"], timeout=opts["timeout"], metadata=metadata,
            limit_key=opts["limit_key"], countdown=opts["countdown"], eta=opts["eta"],
            retry_policy=opts["retry_policy"], dedupe_key=opts["dedupe_key"],
            _task_id=owners.CLI_PREFIX + str(uuid.uuid4()),  # the task remembers it came from the CLI
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
                out["error"] = f"TimeoutError: {exc}"
                code = EXIT_WAIT_TIMEOUT
            else:
                if async_result.successful():
                    out["result"] = outcome
                else:
                    out["result"] = None
                    out["error"] = f"{type(outcome).__name__}: {outcome}"
                    code = EXIT_FAILED
            out["state"] = async_result.state
            if code == EXIT_WAIT_TIMEOUT:
                out.update(where_it_is(result.task_id, result.chat_id, out["state"]))
        self.stdout.write(dumps(out))
        if code:
            raise SystemExit(code)

    def _dispatch_file(self, opts: dict, metadata: object) -> None:
        for clash in ("payload", "idempotency_key", "dedupe_key", "wait"):
            if opts[clash]:
                flag = "--" + clash.replace("_", "-")
                raise CommandError(f"{flag} does not go with --payloads-file (give it per line in the file)",
                                   returncode=EXIT_USAGE)
        name = opts["payloads_file"]
        try:
            source = sys.stdin if name == "-" else open(name, encoding="utf-8")
            results = open(opts["results"], "w", encoding="utf-8") if opts["results"] else None
        except OSError as exc:
            raise CommandError(f"--payloads-file/--results: {exc}", returncode=EXIT_USAGE) from None

        def write_result(line: int, result) -> None:
            if results is not None:
                results.write(json.dumps({"line": line, **result.as_dict()}, ensure_ascii=False) + "\n")

        def progress(summary) -> None:
            if summary.lines >= bulk.CHUNK_ITEMS:  # a long file: say how far it got, chunk by chunk
                self.stderr.write(summary.progress())

        defaults = {"chat_id": opts["chat_id"], "priority": opts["priority"], "timeout": opts["timeout"],
                    "metadata": metadata, "limit_key": opts["limit_key"]}
        try:
            summary = dispatch_lines(opts["task_type"], source, defaults=defaults, on_result=write_result,
                                     on_chunk=progress, id_prefix=owners.CLI_PREFIX)
        except UnicodeDecodeError as exc:
            raise CommandError(f"--payloads-file {name} is not UTF-8 text: {exc}", returncode=EXIT_USAGE) from None
        finally:
            if source is not sys.stdin:
                source.close()
            if results is not None:
                results.close()
        self.stdout.write(dumps(summary.as_dict()))
        if summary.unavailable:
            raise SystemExit(EXIT_UNAVAILABLE)
        if summary.rejected:
            raise SystemExit(EXIT_REJECTED)


#: A live record's state (lanes: admit.lua, start.lua, retry.lua) as the Celery state it stands for.
_RECORD_STATES = {"running": "STARTED", "queued": "PENDING", "scheduled": "PENDING", "limited": "PENDING",
                  "retry": "RETRY"}


def where_it_is(task_id: str, chat_id: str | None, stored: str) -> dict[str, str]:
    """``state`` and ``record_state`` of a task --wait gave up on: a running task has no result row
    yet, so Celery's PENDING would hide that it runs; Redis's record says where it is."""
    if stored != "PENDING":
        return {"state": stored}
    try:
        client = get_redis()
        record = records.locate(client, task_id, chat_id)
        raw = client.hget(record, "st") if record else None
    except Exception:  # noqa: BLE001 - Redis gone: say what is known
        return {"state": stored, "record_state": "unknown (Redis did not answer)"}
    st = raw.decode() if isinstance(raw, bytes) else raw
    if not st:
        return {"state": stored}
    return {"state": _RECORD_STATES.get(st, stored), "record_state": st}


def _json_arg(name: str, text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{name} is not valid JSON: {exc}", returncode=EXIT_USAGE) from None
