"""``dispatch``: admission in the caller, one Redis call, and a result at once.

``dispatch.delay(type, payload, chat_id=..., ...)`` never raises for bad input
or a full queue: it returns a ``DispatchResult`` whose ``reason`` says why it
was not accepted. Services that do not import this code send the same call by
name (``app.send_task("tasks.dispatch", ...)``); a worker on the ``ingress``
queue runs the same admission for them.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import redis
from celery import Task, current_app, shared_task
from celery.result import AsyncResult
from django.conf import settings

from lanes import keys
from lanes.consumers import no_consumer_detail
from lanes.lua.admit import admit as lua_admit
from lanes.messages import Envelope, build_message
from lanes.priorities import to_kombu
from tasks import cancel as cancelling
from tasks import config
from tasks import signals as lifecycle
from tasks.estimate import estimate_delay, limit_wait
from tasks.schedule import due_at
from tasks.validation import Invalid, check_dispatch, check_limits, shown

logger = logging.getLogger(__name__)


@dataclass
class DispatchResult:
    accepted: bool
    task_id: str | None = None
    queue: str | None = None
    priority: int | None = None
    position: int | None = None
    reason: str | None = None
    detail: str = ""
    duplicate: bool = False
    estimated_delay: float | None = None

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.1) -> Any:
        """Wait for the task's outcome, like Celery's ``AsyncResult.get``."""
        if not self.task_id:
            raise ValueError(f"dispatch was not accepted ({self.reason}): there is no task to wait for")
        return self.async_result().get(timeout=timeout, propagate=propagate, interval=interval)

    def cancel(self, reason: str = "", *, by: str = "") -> cancelling.CancelResult:
        """Cancel this task (``tasks.cancel.cancel_task``); a rejected dispatch answers ``invalid``."""
        if not self.task_id:
            return cancelling.CancelResult("", "invalid", f"dispatch was not accepted ({self.reason})")
        return cancelling.cancel_task(self.task_id, reason, by=by)

    def async_result(self) -> AsyncResult:
        return AsyncResult(self.task_id, app=current_app._get_current_object())

    @property
    def id(self) -> str | None:
        return self.task_id

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rejected(type_name: str, lane: str, reason: str, detail: str) -> DispatchResult:
    result = DispatchResult(accepted=False, reason=reason, detail=detail)
    lifecycle.emit_rejected(type_name, lane, reason, detail)
    return result


def payload_digest(payload_json: str) -> str:
    return hashlib.blake2b(payload_json.encode("utf-8"), digest_size=16).hexdigest()


def admit(
    task_type: str,
    payload: Any,
    *,
    chat_id: str | None = None,
    priority: int | None = None,
    idempotency_key: str | None = None,
    timeout: float | None = None,
    metadata: dict | None = None,
    limit_key: str | None = None,
    countdown: float | None = None,
    eta: datetime | str | None = None,
    retry_policy: str | None = None,
    _replace_idempotency: bool = False,
    _task_id: str | None = None,
) -> DispatchResult:
    """Validate, admit and publish one task; see the module docstring.

    ``countdown`` (seconds) or ``eta`` (an aware datetime, or ISO 8601 text with
    an offset) sends it for later (``tasks.schedule``); ``retry_policy`` names the
    RetryPolicy its failed attempts follow instead of its type's.

    ``_task_id`` (a dead letter's requeue) fixes the new task's id: with
    ``_replace_idempotency`` a task of that id already stored answers ``dup``.
    """
    try:
        snap = config.current()
    except redis.RedisError as exc:
        return _unavailable(exc, None)
    task_id = _task_id or str(uuid.uuid4())
    confirmed = False
    for _ in range(4):
        tc = snap.types.get(task_type) if isinstance(task_type, str) else None
        now = time.time()
        try:
            if tc is None:
                raise Invalid("unknown_type", f"no task type named {shown(task_type, 100)}")
            checked = check_dispatch(
                type_name=tc.name, enabled=tc.enabled, chat_scoped=tc.chat_scoped,
                max_payload_bytes=tc.max_payload_bytes, default_priority=tc.priority,
                default_timeout_s=tc.timeout_s, payload=payload, priority=priority, timeout=timeout,
                chat_id=chat_id, idempotency_key=idempotency_key, metadata=metadata,
            )
            bases = _limit_bases(tc, checked.chat_id, limit_key) if tc.limits or limit_key is not None else ()
            due = None
            if countdown is not None or eta is not None:
                due = due_at(countdown=countdown, eta=eta, now_s=now, deadline_s=now + checked.timeout_s,
                             max_delay_s=settings.DISPATCH_MAX_DELAY_S)
            if retry_policy is not None:
                _check_policy(retry_policy, snap)
        except Invalid as exc:
            # A rejection may come from a cached config older than a fresh admin
            # save: confirm the version (one GET, on the rejection path only).
            if not confirmed:
                confirmed = True
                try:
                    fresh = config.refresh_if_changed()
                except redis.RedisError:
                    fresh = snap
                if fresh.version != snap.version:
                    snap = fresh
                    continue
            name = tc.name if tc else task_type[:100] if isinstance(task_type, str) else shown(task_type, 100)
            return _rejected(name, tc.lane if tc else "", exc.reason, exc.detail)
        lane = snap.lanes.get(tc.lane)
        chat = checked.chat_id if tc.chat_scoped else ""
        envelope = Envelope(
            type=tc.name, lane=tc.lane, priority=checked.priority, attempt=1,
            deadline=now + checked.timeout_s, dispatched_at=now, chat=chat,
            key=checked.idempotency_key, meta=checked.metadata or None, policy=retry_policy or "",
            due=due or 0.0,
        )
        soft_limit = min(tc.attempt_timeout_s, checked.timeout_s)
        message = build_message(task_id, tc.handler, checked.payload_json, envelope, soft_limit)
        kombu_priority = to_kombu(checked.priority)
        try:
            reply = lua_admit(
                version=snap.version, now=now, task_id=task_id, message=message, kombu_priority=kombu_priority,
                lane=tc.lane, task_type=tc.name, accepting=lane is None or lane.accepting,
                capacity=lane.capacity if lane else 0, chat=chat, chat_queue_size=tc.chat_queue_size,
                idempotency_key=checked.idempotency_key or "",
                payload_digest=payload_digest(checked.payload_json) if checked.idempotency_key else "",
                idempotency_window_s=tc.idempotency_window_s,
                queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
                replace_idempotency=_replace_idempotency, deadline=envelope.deadline, limits=bases, due=due or 0.0,
            )
        except redis.RedisError as exc:
            logger.warning("dispatch_unavailable type=%s error=%s", tc.name, exc)
            return _unavailable(exc, task_id)
        status = reply[0].decode()
        if status == "stale":
            try:
                snap = config.ensure(reply[1].decode())
            except redis.RedisError as exc:  # a rejection is a result, never an exception
                return _unavailable(exc, None)
            continue
        return _interpret(reply, status, task_id, tc, checked, now, snap.limits, due)
    return DispatchResult(accepted=False, reason="unavailable", detail="configuration kept changing during dispatch")


def _limit_bases(tc: config.TypeConf, chat_id: str, limit_key: Any) -> tuple[str, ...]:
    """The limit instances a task of ``tc`` is subject to (``keys.limit_base``), in the type's order."""
    key = check_limits(type_name=tc.name, limits=tuple((r.name, r.scope) for r in tc.limits), limit_key=limit_key,
                       chat_id=chat_id)
    value = {"global": "", "chat": chat_id, "key": key}
    return tuple(keys.limit_base(ref.name, value[ref.scope]) for ref in tc.limits)


def _check_policy(name: Any, snap: config.Snapshot) -> None:
    """``unknown_retry_policy`` unless ``name`` is a RetryPolicy that exists."""
    if not isinstance(name, str) or name not in snap.policies:
        known = ", ".join(sorted(snap.policies)[:10]) or "none"
        raise Invalid("unknown_retry_policy", f"no retry policy named {shown(name, 80)} (known: {known})")


def _unavailable(exc: redis.RedisError, task_id: str | None) -> DispatchResult:
    """``unavailable``, saying whether the admission script may have run.

    An error while connecting (or Redis still loading its data) means the script
    was never sent: nothing was written. Any other error (a timeout, a connection
    cut while waiting for the answer) leaves the outcome unknown: the task may be
    stored. Either way a caller retries with the same idempotency key, which
    returns the stored task if there is one and never makes a second.
    """
    never_sent = task_id is None or isinstance(exc, (redis.AuthenticationError, redis.BusyLoadingError)) or (
        isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) and "connecting to" in str(exc))
    if never_sent:
        detail = f"nothing was written: Redis unreachable ({exc}); retry later"
    else:
        detail = (f"outcome unknown: Redis did not answer ({exc}); the task may have been stored as {task_id}; "
                  "retry with the same idempotency key")
    return DispatchResult(accepted=False, reason="unavailable", detail=detail)


def _interpret(reply: list, status: str, task_id: str, tc: config.TypeConf, checked, now: float,
               limits: dict[str, dict] | None = None, due: float | None = None) -> DispatchResult:
    if status == "dup":
        return DispatchResult(True, reply[1].decode(), tc.lane, checked.priority, duplicate=True)
    if status == "conflict":
        return _rejected(
            tc.name, tc.lane, "idempotency_conflict",
            f"idempotency key {checked.idempotency_key!r} was used by task {reply[1].decode()} with another payload",
        )
    if status == "rej":
        reason = reply[1].decode()
        detail = {
            "lane_closed": f"lane '{tc.lane}' is not accepting tasks",
            "lane_full": f"lane '{tc.lane}' holds {int(reply[2])} tasks, its capacity",
            "chat_queue_full": f"chat {checked.chat_id!r} already has {tc.chat_queue_size} queued messages",
        }.get(reason, reason)
        return _rejected(tc.name, tc.lane, reason, detail)
    position = int(reply[1])
    waits_on = reply[10].decode() if len(reply) > 10 else ""
    limit = None
    if waits_on:  # a limit did not admit it yet: its turn there bounds the wait
        name = waits_on[len(keys.LIMIT_PREFIX):].split(":", 1)[0]
        limit = limit_wait(name, int(reply[11]), (limits or {}).get(name), paused_for_s=int(reply[12]) / 1000)
    estimated, why = estimate_delay(
        lane=tc.lane, ahead_in_lane=int(reply[5]), ahead_in_chat=position - 1 if tc.chat_scoped else 0,
        completed=int(reply[3]) + int(reply[4]), busy_s=float(reply[6]) + float(reply[7]),
        window_s=60 + now % 60, paused=int(reply[8]) == 1, consumers=int(reply[9]), limit=limit,
    )
    if int(reply[9]) == 0 and int(reply[8]) != 1:
        why = no_consumer_detail(tc.lane)
    if due is not None and int(reply[8]) != 1 and int(reply[9]) != 0:
        # Sent for later: it cannot start before it is due, nor before the work ahead of it
        # now (when that can be estimated: the lane may have drained by then).
        estimated, why = round(max(estimated or 0.0, due - now), 3), ""
    result = DispatchResult(True, task_id, tc.lane, checked.priority, position, detail=why,
                            estimated_delay=estimated)
    lifecycle.emit_queued(task_id, tc.name, tc.lane, checked.chat_id if tc.chat_scoped else "")
    return result


class DispatchTask(Task):
    """``delay``/``apply_async`` run admission here, in the caller, instead of publishing."""

    def delay(self, *args: Any, **kwargs: Any) -> DispatchResult:
        return admit(*args, **kwargs)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> DispatchResult:
        """As Celery's: ``countdown`` / ``eta`` given as options send the task for later, as in ``kwargs``."""
        kwargs = dict(kwargs or {})
        for name in ("countdown", "eta"):
            if options.get(name) is not None:
                kwargs.setdefault(name, options[name])
        return admit(*(args or ()), **kwargs)

    def cancel(self, task_id: Any, reason: Any = "", *, by: Any = "") -> cancelling.CancelResult:
        """Cancel a task by id: removed if it waits, told if it runs; answers what it found, never raises."""
        return cancelling.cancel_task(task_id, reason, by=by)

    def cancel_chat(self, chat_id: Any, reason: Any = "", *, by: Any = "") -> list[cancelling.CancelResult]:
        """Cancel everything queued for a chat (its running head is told)."""
        return cancelling.cancel_chat(chat_id, reason, by=by)

    def cancel_key(self, task_type: Any, idempotency_key: Any, reason: Any = "", *,
                   by: Any = "") -> cancelling.CancelResult:
        """Cancel the task a ``(task_type, idempotency_key)`` names."""
        return cancelling.cancel_key(task_type, idempotency_key, reason, by=by)


#: ``from tasks.dispatch import cancel_chat`` (the same as ``dispatch.cancel_chat``).
cancel_chat = cancelling.cancel_chat
cancel_key = cancelling.cancel_key


@shared_task(base=DispatchTask, name="tasks.dispatch", typing=False)
def dispatch(task_type: Any = None, payload: Any = None, **options: Any) -> dict[str, Any]:
    """Run by an ``ingress`` worker for callers that send ``tasks.dispatch`` by name."""
    allowed = {"chat_id", "priority", "idempotency_key", "timeout", "metadata", "limit_key", "countdown", "eta",
               "retry_policy"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        return DispatchResult(False, reason="invalid_payload", detail=f"unknown dispatch options: {unknown}").as_dict()
    return admit(task_type, payload, **options).as_dict()
