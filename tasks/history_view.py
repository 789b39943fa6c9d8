"""Reading a task's history for the API and the admin: its events (``tasks.history``) beside its record,
dead letter and result row, so the story holds even where an event is missing (a task no worker started).

A task's events are in its history key (what its workers flushed) and then in its final result row (what its
last worker still held when it stored the row, ``tasks.history.take_for_row``): read in that order, the row's
once the key's, they are in the order they happened."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from django_celery_results.models import TaskResult
from redis.exceptions import ResponseError

from lanes import keys, records
from lanes.redis_client import get_redis
from tasks.history import ROW_META_KEY, dispatched_fields, envelope_of, events_of, retention_s
from tasks.models import DeadLetter
from tasks.owners import owner_of

#: A live record's state (``st``, lanes/lua/_lib.lua) in a user's words, and the API's state name.
LIVE_STATES = {"queued": ("waiting for a worker", "PENDING"), "scheduled": ("scheduled for later", "SCHEDULED"),
               "limited": ("waiting on a limit", "PENDING"), "retry": ("waiting to retry", "RETRY"),
               "running": ("running", "STARTED"), "done": ("succeeded", "SUCCESS"),
               "dead": ("dead letter", "FAILURE"), "cancelled": ("cancelled", "REVOKED")}
ROW_STATES = {"SUCCESS": "succeeded", "FAILURE": "failed (dead letter)", "REVOKED": "cancelled",
              "RETRY": "waiting to retry", "STARTED": "running", "PENDING": "waiting for a worker"}


@dataclass
class AttemptView:
    number: int
    worker: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str = "running"
    error: str = ""
    waited_s: float | None = None
    retry_delay_s: float | None = None


@dataclass
class History:
    """Everything known of one task, for the admin's page and the API's ``history``."""

    task_id: str
    by: str
    state: str  # the API's name (SCHEDULED, PENDING, STARTED, RETRY, SUCCESS, FAILURE, REVOKED)
    state_text: str  # in a user's words
    dispatched: dict[str, Any] | None = None
    waiting: dict[str, Any] | None = None
    attempts: list[AttemptView] = field(default_factory=list)
    cancelled: dict[str, Any] | None = None
    dead_letter: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["attempt_count"] = len(self.attempts)
        return out


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


def read_progress(client: Any, task_id: str) -> dict[str, Any] | None:
    raw = client.get(keys.task_progress(task_id))
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def attempts_of(events: list[dict[str, Any]]) -> list[AttemptView]:
    """Each attempt from the events (pure): a ``started`` opens one; its outcome closes it.

    An attempt started again with the same number was delivered again: the earlier
    one's worker was lost before it could end it.
    """
    out: list[AttemptView] = []
    for event in events:
        kind, number = event.get("kind"), int(event.get("attempt") or 0)
        if kind == "started":
            if out and out[-1].number == number and out[-1].outcome == "running":
                out[-1].outcome = "worker lost"
            out.append(AttemptView(number, str(event.get("worker") or ""), event.get("at"),
                                   waited_s=event.get("waited_s")))
        elif kind in ("succeeded", "retry", "dead", "cancelled") and out and out[-1].outcome == "running":
            last = out[-1]
            last.ended_at = event.get("at")
            last.outcome = {"retry": "failed, retried", "dead": "dead letter"}.get(kind, kind)
            last.error = str(event.get("error") or event.get("reason") or "")
            if kind == "retry":
                last.retry_delay_s = event.get("delay_s")
    return out


def _event_lines(client: Any, key: str) -> list[Any]:
    """A history's events as written (``tasks.history``: text, one a line); a list written before that format."""
    try:
        return events_of(client.get(key))
    except ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        return client.lrange(key, 0, -1)


def row_events(row: Any, now: float | None = None) -> list[str]:
    """The events a result row carries (``tasks.history.ROW_META_KEY`` in its ``meta``), none once the row is
    older than a history is kept (``retention_s``: the key it stands for would have expired)."""
    meta = _decoded(getattr(row, "meta", None))
    text = meta.get(ROW_META_KEY) if isinstance(meta, dict) else None
    if not isinstance(text, str) or not text:
        return []
    done = getattr(row, "date_done", None)
    if done is not None and (time.time() if now is None else now) - done.timestamp() > retention_s():
        return []
    return events_of(text)


def read(task_id: str) -> History | None:
    """The history of ``task_id`` from Redis and the database; None when nothing knows it."""
    client = get_redis()
    row = TaskResult.objects.filter(task_id=task_id).first()
    events = []
    lines = _event_lines(client, keys.task_history(task_id))
    if row is not None:
        lines = [*lines, *row_events(row)]
    for raw in lines:
        try:
            events.append(json.loads(raw))
        except ValueError:
            continue
    history = History(task_id, owner_of(task_id), "", "", events=events)
    history.progress = read_progress(client, task_id)
    history.attempts = attempts_of(events)
    for event in events:
        if event.get("kind") == "dispatched" and history.dispatched is None:
            history.dispatched = {k: v for k, v in event.items() if k != "kind"}
        if event.get("kind") == "cancelled":
            history.cancelled = {"at": event.get("at"), "detail": event.get("detail") or event.get("reason") or ""}
        if event.get("kind") == "cancel_asked" and history.cancelled is None:
            history.cancelled = {"at": event.get("at"), "detail": f"asked while it ran: {event.get('detail') or ''}"}
    live = None
    record = records.locate(client, task_id)
    if record:
        st, lane, chat, att, msg, eta = client.hmget(record, "st", "lane", "chat", "att", "msg", "eta")
        if st:
            live = _text(st)
            waiting: dict[str, Any] = {"state": live, "lane": _text(lane), "attempt": int(att or 0)}
            if chat:
                waiting["chat_id"] = _text(chat)
                position = client.lpos(keys.chat_queue(_text(chat)), task_id)
                waiting["chat_position"] = position  # 0: the chat's head; None: no longer in its queue
            if eta:
                waiting["eta"] = int(eta) / 1000
            history.waiting = waiting
            if history.dispatched is None and msg:
                try:
                    history.dispatched = {**dispatched_fields(envelope_of(msg)), "by": history.by}
                except (ValueError, KeyError, TypeError):
                    pass
    dead = DeadLetter.objects.filter(task_id=task_id).first()
    if dead is not None:
        history.dead_letter = {"reason": dead.reason, "error": dead.error_message, "status": dead.status,
                               "at": dead.died_at.timestamp() if dead.died_at else None,
                               "requeued_task_id": dead.requeued_task_id}
        if history.dispatched is None:
            history.dispatched = {
                "at": dead.dispatched_at.timestamp() if dead.dispatched_at else None, "type": dead.task_type,
                "lane": dead.lane, "by": history.by,
                "options": {k: v for k, v in (("priority", dead.priority), ("chat_id", dead.chat_id),
                                              ("idempotency_key", dead.idempotency_key),
                                              ("metadata", dead.metadata)) if v not in ("", None, {})}}
    if row is not None:
        history.result = {"state": row.status, "at": row.date_done.timestamp() if row.date_done else None,
                          "worker": row.worker or "", "value": _decoded(row.result)}
        if row.status == "REVOKED" and history.cancelled is None:
            history.cancelled = {"at": history.result["at"], "detail": _error_text(_decoded(row.result))}
    if live in ("done", "dead", "cancelled") and row is not None:
        live = None  # finished and stored: the row speaks
    if live is not None:
        history.state_text, history.state = LIVE_STATES.get(live, ("waiting for a worker", "PENDING"))
    elif row is not None:
        history.state, history.state_text = row.status, ROW_STATES.get(row.status, row.status.lower())
    elif dead is not None:
        history.state, history.state_text = "FAILURE", "failed (dead letter)"
    elif events:
        history.state, history.state_text = "PENDING", "waiting for a worker"
    else:
        return None
    if history.dead_letter and history.state == "FAILURE":
        history.state_text = f"dead letter ({history.dead_letter['reason']})"
    return history


def _decoded(text: Any) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _error_text(value: Any) -> Any:
    """A stored exception (Celery's ``{exc_type, exc_message}``) as its message; anything else as it is."""
    if isinstance(value, dict) and "exc_message" in value:
        message = value["exc_message"]
        return " ".join(map(str, message)) if isinstance(message, (list, tuple)) else str(message)
    return value
