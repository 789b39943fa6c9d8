"""Cancelling tasks that are no longer wanted: by task id, by chat, by idempotency key, a lane's queue.

Redis first, in one atomic call (lanes/lua/cancel.lua): a waiting task is
removed and never runs, a running one is told (``ctx.cancelled``). Then each
task cancelled here gets Celery's ``REVOKED`` result row (reason and who asked)
and its record is settled. If this process dies in between, the record's settle
lease runs out, the sweep republishes it and a worker stores the row from the
record: nothing a cancel did is lost, and nothing cancelled runs.

Every door answers what it found (a ``CancelResult``), never an exception,
and a second cancel of the same task answers ``already_cancelled``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, cast

import redis
from celery import states
from django.conf import settings

from lanes import keys, records
from lanes.lua.cancel import Cancelled
from lanes.lua.cancel import cancel as lua_cancel
from lanes.lua.forget import forget
from lanes.redis_client import get_redis
from tasks import history, results
from tasks import signals as lifecycle
from tasks.validation import MAX_CHAT_ID_LEN, MAX_IDEMPOTENCY_KEY_LEN, is_clean_text, scrub_text

logger = logging.getLogger(__name__)

#: What a cancel found, per task (closed set):
#: ``cancelled``: it was waiting (queued, scheduled, parked for a retry, on a limit, behind its chat's head)
#: and is removed: it never runs. ``running_told``: it is running; its handler is told (``ctx.cancelled``)
#: and it is never retried, but what it already sent stays sent. ``already_cancelled``, ``already_done``,
#: ``already_dead``: it had ended so. ``unknown``: no such task (never accepted, or ended long ago).
#: ``skipped``: a lane purge left it (running, or of another lane). ``invalid``: the id given cannot name
#: a task. ``unavailable``: Redis did not answer (nothing known; safe to send again).
OUTCOMES = ("cancelled", "running_told", "already_cancelled", "already_done", "already_dead", "unknown",
            "skipped", "invalid", "unavailable")
_FROM_SCRIPT = {"cancelled": "cancelled", "told": "running_told", "already": "already_cancelled",
                "done": "already_done", "dead": "already_dead", "unknown": "unknown", "skipped": "skipped"}
_FROM_ROW = {states.REVOKED: "already_cancelled", states.SUCCESS: "already_done", states.FAILURE: "already_dead"}
#: Longest reason kept (the rest is cut), and longest task id accepted.
MAX_REASON_LEN = 500
MAX_TASK_ID_LEN = 255
#: Records one purge call cancels at most (each call is one atomic Redis script).
PURGE_BATCH = 200


@dataclass(frozen=True)
class CancelResult:
    """What one cancel found and did (``outcome`` in ``OUTCOMES``)."""

    task_id: str
    outcome: str
    detail: str = ""

    @property
    def cancelled(self) -> bool:
        """Whether this call removed a waiting task (it will never run)."""
        return self.outcome == "cancelled"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PurgeSummary:
    """What a lane purge did: counts per outcome."""

    lane: str
    counts: dict[str, int]

    @property
    def cancelled(self) -> int:
        return self.counts.get("cancelled", 0)


def default_requester() -> str:
    """Who asked, when the caller does not say: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def describe(reason: Any, by: Any) -> str:
    """The text a REVOKED row (and a running task's flag) carries: who asked, and why."""
    who = scrub_text(str(by))[:200] if by else default_requester()
    why = scrub_text(str(reason))[:MAX_REASON_LEN] if reason else ""
    return f"cancelled by {who}" + (f": {why}" if why else "")


def valid_task_id(task_id: Any) -> bool:
    """Task ids are uuids or derived ids: printable, no ':' or hash-tag braces (they end Redis key names)."""
    return is_clean_text(task_id, MAX_TASK_ID_LEN) and not any(c in task_id for c in ":{}")


def cancel_task(task_id: Any, reason: Any = "", *, by: Any = "", chat_id: Any = None) -> CancelResult:
    """Cancel one task by id (see the module docstring and ``OUTCOMES``).

    ``chat_id``: the task's chat, when the caller knows it (``DispatchResult.cancel`` does): its
    record is then found in one step. Without it, a chat-scoped task's record is searched for
    among the live ones (``lanes.records.locate``: O(live tasks)); a task without a chat is not.
    """
    if not valid_task_id(task_id):
        return CancelResult(str(task_id)[:MAX_TASK_ID_LEN], "invalid", "not a task id")
    if chat_id is not None and chat_id != "" and not is_clean_text(chat_id, MAX_CHAT_ID_LEN):
        return CancelResult(task_id, "invalid", f"chat_id must be 1..{MAX_CHAT_ID_LEN} printable characters")
    detail = describe(reason, by)
    try:
        # Not found: the plain key, whose absence cancel.lua answers from the tombstone (by task id).
        record = records.locate(get_redis(), task_id, chat_id or None) or keys.task_record(task_id)
        found = _run(detail, targets=[(task_id, record)])
    except redis.RedisError as exc:
        return CancelResult(task_id, "unavailable", f"Redis did not answer ({exc}); nothing known, send again")
    return found[0] if found else CancelResult(task_id, "unknown")


def cancel_chat(chat_id: Any, reason: Any = "", *, by: Any = "") -> list[CancelResult]:
    """Cancel everything queued for ``chat_id`` in one atomic step (its running head is told)."""
    if not is_clean_text(chat_id, MAX_CHAT_ID_LEN):
        return [CancelResult("", "invalid", f"chat_id must be 1..{MAX_CHAT_ID_LEN} printable characters")]
    try:
        return _run(describe(reason, by), chat=chat_id)
    except redis.RedisError as exc:
        return [CancelResult("", "unavailable", f"Redis did not answer ({exc}); nothing known, send again")]


def cancel_key(task_type: Any, idempotency_key: Any, reason: Any = "", *, by: Any = "") -> CancelResult:
    """Cancel the task an idempotency key of ``task_type`` names (within the type's idempotency window)."""
    if not is_clean_text(task_type, 100) or not is_clean_text(idempotency_key, MAX_IDEMPOTENCY_KEY_LEN):
        return CancelResult("", "invalid", "a task type and an idempotency key (printable text) are required")
    try:
        client = get_redis()
        task_id, chat = cast("list[bytes | None]", client.hmget(
            keys.idempotency(task_type, idempotency_key), "task", "chat"))
        if not task_id:
            task_id = cast("bytes | None", client.hget(keys.legacy_idempotency(task_type, idempotency_key), "task"))
    except redis.RedisError as exc:
        return CancelResult("", "unavailable", f"Redis did not answer ({exc}); nothing known, send again")
    if not task_id:
        return CancelResult("", "unknown", f"no task of {task_type!r} holds idempotency key {idempotency_key!r}")
    # The key keeps its task's chat (admit.lua): no search (a key stored before it did: searched).
    return cancel_task(task_id.decode(), reason, by=by, chat_id=chat.decode(errors="replace") if chat else None)


def purge_lane(lane: str, reason: Any = "", *, by: Any = "") -> PurgeSummary:
    """Cancel every task waiting in ``lane`` (running ones are left alone), a batch per Redis call.

    Walks the deadlines set (every waiting task is in it, whatever it waits
    for), so the cost is the backlog's, in small atomic steps. A task dispatched
    while the purge runs may be cancelled or not: close the lane first for a
    clean cut (the admin's purge says so).
    """
    detail = describe(reason, by)
    counts: dict[str, int] = {}
    client = get_redis()
    cursor = 0
    while True:
        cursor, members = client.zscan(keys.DEADLINES, cursor, count=PURGE_BATCH)
        targets = []
        for member, _score in members:
            record = member.decode() if isinstance(member, bytes) else str(member)
            targets.append((record.rsplit(":", 1)[-1], record))
        if targets:
            for found in _run(detail, targets=targets, lane=lane, waiting_only=True):
                if found.outcome == "elsewhere":  # a waiting task of another lane: not this purge's business
                    continue
                counts[found.outcome] = counts.get(found.outcome, 0) + 1
        if cursor == 0:
            break
    return PurgeSummary(lane, counts)


def _run(detail: str, *, targets: Iterable[tuple[str, str]] = (), chat: str = "", lane: str = "",
         waiting_only: bool = False) -> list[CancelResult]:
    """One cancel.lua call, then the REVOKED rows of what it cancelled, then their records settled."""
    targets = list(targets)
    detail_json = json.dumps(detail)
    answers = lua_cancel(
        now=time.time(), detail=detail, detail_json=detail_json, tombstone_ttl_s=tombstone_ttl_s(),
        settle_lease_ms=int(settings.DISPATCH_LEASE_S * 1000),
        queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000), targets=targets, chat=chat, lane=lane,
        waiting_only=waiting_only,
    )
    out = [_answer(found, detail) for found in answers]
    _settle(answers, detail, _records(targets, chat, answers))
    for answer in out:
        if answer.outcome == "elsewhere":
            continue
        logger.info("task_cancel task=%s outcome=%s by=%r", answer.task_id, answer.outcome, detail)
    return out


def settle_replaced(task_id: str, chat: str, detail: str, task_type: str, lane: str) -> None:
    """A debounced task admit.lua cancelled for a newer one (``detail``: "replaced by ..."): its REVOKED row,
    then its record settled, as for any cancel (a caller that dies first leaves it to the settle lease)."""
    found = Cancelled(task_id, "cancelled", "", lane, task_type, chat)
    _settle([found], detail, [(task_id, keys.task_record(task_id, chat or None))])
    logger.info("task_replaced task=%s by=%r", task_id, detail)


def _settle(answers: list[Cancelled], detail: str, targets: list[tuple[str, str]]) -> None:
    """The REVOKED rows of what cancel.lua cancelled, then their records (``targets``: id, record) settled."""
    settled = []
    for found in answers:
        if found.outcome == "told":
            history.note(found.task_id, "cancel_asked", detail=detail)  # it ends as its handler decides
        if found.outcome != "cancelled":
            continue
        try:
            results.store_revoked(found.task_id, detail)
        except Exception:  # the record's lease brings the row back (module docstring)
            logger.warning("revoked_row_not_written task=%s", found.task_id, exc_info=True)
            continue
        settled.append(found.task_id)
        results.announce_revoked(found.task_id)
        lifecycle.emit(lifecycle.task_finished, functools.partial(
            lifecycle.TaskInfo, found.task_id, found.type, found.lane, found.chat, outcome="cancelled",
            reason="cancelled", detail=detail))
    if settled:
        pairs = [(t, r) for t, r in targets if t in settled]
        history.cancelled_waiting(pairs, detail)
        records = [r for _, r in pairs]
        try:
            forget(records)
        except redis.RedisError:  # their settle lease runs out; a worker settles them then
            logger.warning("cancelled_records_not_settled count=%d", len(records))


def _records(targets: Iterable[tuple[str, str]], chat: str, answers: list[Cancelled]) -> list[tuple[str, str]]:
    if chat:
        return [(a.task_id, keys.task_record(a.task_id, chat)) for a in answers]
    return list(targets)


def _answer(found: Cancelled, detail: str) -> CancelResult:
    outcome = _FROM_SCRIPT.get(found.outcome, found.outcome)
    text = {"cancelled": detail, "running_told": f"running: told ({detail}); what it already sent stays sent"}.get(
        outcome, _plain(found.detail))
    if outcome == "unknown":
        # Gone from Redis (settled, tombstone expired): the result row still says how it ended.
        try:
            row = results.stored_state(found.task_id)
        except Exception:  # noqa: BLE001 - no database: say what Redis said
            row = None
        outcome = _FROM_ROW.get(row or "", "unknown")
        text = f"result row: {row}" if row else "no such task (never accepted, or ended long ago)"
    return CancelResult(found.task_id, outcome, text)


def _plain(stored: str) -> str:
    """A stored result (JSON) as text, for an answer."""
    try:
        value = json.loads(stored) if stored else ""
    except ValueError:
        return stored[:500]
    return (value if isinstance(value, str) else json.dumps(value))[:500]


def tombstone_ttl_s() -> int:
    """As long as a finished task's tombstone (tasks.execution), so a late copy meets it."""
    return int(max(settings.DISPATCH_QUEUED_LEASE_S, 4 * settings.DISPATCH_LEASE_S))
