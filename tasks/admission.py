"""The steps of admission, which ``tasks.bulk.Admission`` runs for every dispatch (one alone, or a chunk).

``prepare`` validates a dispatch against the task types in force and builds
its admit.lua item (``script_chunk`` what a chunk's items share);
``interpret`` turns admit.lua's decoded reply into the ``DispatchResult`` the
caller gets; ``unavailable`` is the answer when Redis did not give one.
``dispatch.delay`` is a chunk of one, ``dispatch_many`` chunks of many: both
accept and refuse exactly the same input, with the same reasons.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import redis
from celery import current_app
from celery.result import AsyncResult
from django.conf import settings

from lanes import keys
from lanes.consumers import no_consumer_detail
from lanes.lua import admit
from lanes.messages import Envelope, build_message, hard_limit_grace_s
from lanes.priorities import to_kombu
from tasks import cancel as cancelling
from tasks import config, owners, results
from tasks import dedupe as dedupe_rules
from tasks import signals as lifecycle
from tasks.estimate import estimate_delay, limit_wait
from tasks.schedule import due_at
from tasks.validation import (
    MAX_IDEMPOTENCY_KEY_LEN,
    Checked,
    Invalid,
    check_dispatch,
    check_limits,
    is_clean_text,
    shown,
)


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
    #: The task a debounce replaced (it ends REVOKED, "replaced by" this one), else None.
    replaced: str | None = None
    #: The task's chat ('' if none), so that ``cancel`` finds its record in one step; not in ``as_dict``.
    chat_id: str = field(default="", repr=False, compare=False)
    #: Its type's ``store_result``: where ``get`` waits for the outcome; not in ``as_dict``.
    store_result: str = field(default="always", repr=False, compare=False)

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.1) -> Any:
        """Wait for the task's outcome, like Celery's ``AsyncResult.get``.

        A type that keeps no row for its successes (``store_result`` 'failures' or 'never') is waited
        for in Redis, which keeps a task's outcome for a few minutes after it ended.
        """
        if not self.task_id:
            raise ValueError(f"dispatch was not accepted ({self.reason}): there is no task to wait for")
        if self.store_result != "always":
            return results.outcome_from_redis(self.task_id, timeout, propagate, interval,
                                              failures_have_rows=self.store_result == "failures")
        return self.async_result().get(timeout=timeout, propagate=propagate, interval=interval)

    def cancel(self, reason: str = "", *, by: str = "") -> cancelling.CancelResult:
        """Cancel this task (``tasks.cancel.cancel_task``); a rejected dispatch answers ``invalid``."""
        if not self.task_id:
            return cancelling.CancelResult("", "invalid", f"dispatch was not accepted ({self.reason})")
        return cancelling.cancel_task(self.task_id, reason, by=by, chat_id=self.chat_id or None)

    def async_result(self) -> AsyncResult:
        return AsyncResult(self.task_id, app=current_app._get_current_object())

    @property
    def id(self) -> str | None:
        return self.task_id

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["chat_id"], out["store_result"]
        return out


def _rejected(type_name: str, lane: str, reason: str, detail: str) -> DispatchResult:
    result = DispatchResult(accepted=False, reason=reason, detail=detail)
    lifecycle.emit_rejected(type_name, lane, reason, detail)
    return result


def payload_digest(payload_json: str) -> str:
    return hashlib.blake2b(payload_json.encode("utf-8"), digest_size=16).hexdigest()

@dataclass(slots=True)
class Prepared:
    """One dispatch validated against a config snapshot: its admit.lua item, and what reading its reply needs.

    Not frozen, like ``Checked``: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, four times the cost, paid per item of a bulk dispatch; nothing changes one.
    """

    tc: config.TypeConf
    checked: Checked
    now: float
    task_id: str
    item: admit.Item
    #: When it was sent for later (``countdown``/``eta``): its due time, seconds since the epoch.
    due: float | None = None


class ChunkContext(NamedTuple):
    """What every dispatch of one admission call shares: its time (admit.lua admits a chunk at one
    time) and the settings ``prepare`` reads, read once a chunk (a Django setting is a Python-level
    lookup: three of them were a twentieth of a bulk item's CPU)."""

    now: float  # epoch seconds
    grace_s: float  # lanes.messages.hard_limit_grace_s()
    queued_lease_ms: int


class DispatchSettings(NamedTuple):
    """The Django settings every dispatch reads, read once and again after ``setting_changed`` (sent by
    ``override_settings``; Django's settings are not changed at run time otherwise). A read of
    ``django.conf.settings`` goes through ``LazyObject.__getattribute__``, Python code run for every
    attribute (about 5K instructions): five of them were a sixth of a lone dispatch's CPU."""

    redis_timeout_s: float  # DISPATCH_REDIS_TIMEOUT_S
    replica_acks: int  # DISPATCH_REPLICA_ACKS
    replica_acks_timeout_ms: int  # DISPATCH_REPLICA_ACKS_TIMEOUT_MS
    queued_lease_ms: int  # DISPATCH_QUEUED_LEASE_S, in ms
    grace_s: float  # lanes.messages.hard_limit_grace_s()


_settings: DispatchSettings | None = None


def dispatch_settings() -> DispatchSettings:
    """The settings a dispatch reads (``DispatchSettings``)."""
    global _settings
    found = _settings
    if found is None:
        found = _settings = DispatchSettings(
            settings.DISPATCH_REDIS_TIMEOUT_S, settings.DISPATCH_REPLICA_ACKS,
            settings.DISPATCH_REPLICA_ACKS_TIMEOUT_MS, int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
            hard_limit_grace_s())
    return found


def forget_settings(**_: Any) -> None:
    """``setting_changed``'s receiver (``tasks.receivers``): the next dispatch reads the settings again."""
    global _settings
    _settings = None


def chunk_context() -> ChunkContext:
    """The context of a chunk admitted now."""
    read = _settings or dispatch_settings()
    return ChunkContext(time.time(), read.grace_s, read.queued_lease_ms)


def script_chunk(snap: config.Snapshot, tc: config.TypeConf, context: ChunkContext,
                 replace_idempotency: bool = False, lane_share: int = owners.WHOLE_LANE_PCT) -> admit.Chunk:
    """admit.lua's chunk arguments for dispatches of ``tc`` prepared under ``snap`` and ``context``;
    ``lane_share``: the percentage of the lane's capacity one token's tasks may hold (``caller_quota``)."""
    lane = snap.lanes.get(tc.lane)
    capacity = lane.capacity if lane else 0
    return admit.Chunk(
        version=snap.version, now=context.now, lane=tc.lane, task_type=tc.name,
        accepting=lane is None or lane.accepting, capacity=capacity,
        chat_queue_size=tc.chat_queue_size, idempotency_window_s=tc.idempotency_window_s,
        queued_lease_ms=context.queued_lease_ms, replace_idempotency=replace_idempotency,
        caller_quota=owners.lane_quota(capacity, lane_share),
        **(_dedupe_args(tc) if tc.dedupe != "key" else {}),
    )


def _dedupe_args(tc: config.TypeConf) -> dict[str, Any]:
    """A throttled or debounced type's chunk arguments: its mode and window, and what a replacement's cancel
    needs (as ``tasks.cancel`` gives cancel.lua)."""
    return {"dedupe": tc.dedupe, "dedupe_window_ms": int(tc.dedupe_window_s * 1000),
            "tombstone_ttl_s": cancelling.tombstone_ttl_s(), "settle_lease_ms": int(settings.DISPATCH_LEASE_S * 1000)}


def prepare(
    snap: config.Snapshot, task_type: Any, payload: Any, *, task_id: str, context: ChunkContext,
    chat_id: Any = None, priority: Any = None, idempotency_key: Any = None, timeout: Any = None,
    metadata: Any = None, limit_key: Any = None, countdown: Any = None, eta: Any = None, retry_policy: Any = None,
    dedupe_key: Any = None, trace: dict[str, str] | None = None,
) -> Prepared:
    """Validate one dispatch against ``snap`` and build its message; raise ``Invalid`` naming what is wrong.

    Every dispatch goes through here, one alone or many in a chunk (``tasks.bulk``),
    so all accept and refuse exactly the same input. ``trace``: the caller's trace
    context (``tasks.tracing.dispatching``), never a caller's option.
    """
    tc = snap.types.get(task_type) if isinstance(task_type, str) else None
    if tc is None:
        raise Invalid("unknown_type", f"no task type named {shown(task_type, 100)}")
    checked = check_dispatch(
        type_name=tc.name, enabled=tc.enabled, chat_scoped=tc.chat_scoped,
        max_payload_bytes=tc.max_payload_bytes, default_priority=tc.priority,
        default_timeout_s=tc.timeout_s, payload=payload, priority=priority, timeout=timeout,
        chat_id=chat_id, idempotency_key=idempotency_key, metadata=metadata,
    )
    bases = _limit_bases(tc, checked.chat_id, limit_key) if tc.limits or limit_key is not None else ()
    chat = checked.chat_id if tc.chat_scoped else ""
    now = context.now
    key_text = checked.idempotency_key or ""
    dedupe = ""
    if dedupe_key is not None or tc.dedupe != "key":
        dedupe = _dedupe_key(tc, key_text, dedupe_key)
    due = None
    if countdown is not None or eta is not None:
        due = due_at(countdown=countdown, eta=eta, now_s=now, deadline_s=now + checked.timeout_s,
                     max_delay_s=settings.DISPATCH_MAX_DELAY_S)
    if dedupe and tc.dedupe == "debounce":  # sent for later by the window (or later still, if asked)
        due = max(due or 0.0, now + tc.dedupe_window_s)
    if retry_policy is not None:
        _check_policy(retry_policy, snap)
    envelope = Envelope(
        type=tc.name, lane=tc.lane, priority=checked.priority, attempt=1,
        deadline=now + checked.timeout_s, dispatched_at=now, chat=chat,
        key=checked.idempotency_key, meta=checked.metadata or None, policy=retry_policy or "",
        due=due or 0.0, trace=trace,
    )
    soft_limit = min(tc.attempt_timeout_s, checked.timeout_s)
    message = build_message(task_id, tc.handler, checked.payload_json, envelope, soft_limit, context.grace_s)
    keep_key = not dedupe or dedupe_rules.keeps_idempotency(tc.dedupe, key_text, dedupe_key or "")
    item = admit.Item(
        task_id, message, to_kombu(checked.priority), chat, key_text if keep_key else "",
        payload_digest(checked.payload_json) if key_text and keep_key else "", envelope.deadline, bases,
        due or 0.0, dedupe,
    )
    return Prepared(tc, checked, now, task_id, item, due)


#: The options a caller may give one dispatch (``prepare``'s, as ``dispatch.delay`` takes them), by name and
#: in bulk items: an option added to ``prepare`` is accepted everywhere at once.
DISPATCH_OPTIONS = frozenset(
    name for name, param in inspect.signature(prepare).parameters.items()
    if param.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("task_id", "context", "trace")
)


def confirm_config(snap: config.Snapshot) -> config.Snapshot:
    """The config as Redis has it now, when a rejection may come from a cached one older than an admin save.

    One GET, on the rejection path only; ``snap`` itself if Redis does not answer.
    """
    try:
        return config.refresh_if_changed()
    except redis.RedisError:
        return snap


def rejected_invalid(snap: config.Snapshot, task_type: Any, exc: Invalid) -> DispatchResult:
    """The result of a dispatch that failed validation (``prepare`` raised ``exc``)."""
    tc = snap.types.get(task_type) if isinstance(task_type, str) else None
    name = tc.name if tc else task_type[:100] if isinstance(task_type, str) else shown(task_type, 100)
    return _rejected(name, tc.lane if tc else "", exc.reason, exc.detail)


def memory_high(snap: config.Snapshot, task_type: Any, detail: str) -> DispatchResult:
    """``redis_memory_high``: refused before its admission script, while Redis is near its maxmemory."""
    tc = snap.types.get(task_type) if isinstance(task_type, str) else None
    name = tc.name if tc else task_type[:100] if isinstance(task_type, str) else shown(task_type, 100)
    return _rejected(name, tc.lane if tc else "", "redis_memory_high", detail)


def config_kept_changing() -> DispatchResult:
    return DispatchResult(accepted=False, reason="unavailable", detail="configuration kept changing during dispatch")


def _limit_bases(tc: config.TypeConf, chat_id: str, limit_key: Any) -> tuple[str, ...]:
    """The limit instances a task of ``tc`` is subject to (``keys.limit_base``), in the type's order."""
    key = check_limits(type_name=tc.name, limits=tuple((r.name, r.scope) for r in tc.limits), limit_key=limit_key,
                       chat_id=chat_id)
    value = {"global": "", "chat": chat_id, "key": key}
    return tuple(keys.limit_base(ref.name, value[ref.scope]) for ref in tc.limits)


def _dedupe_key(tc: config.TypeConf, idempotency_key: str, dedupe_key: Any) -> str:
    """The key a throttle or debounce of ``tc`` goes by ('' none); ``invalid_dedupe_key`` for a bad one."""
    if dedupe_key is not None and not is_clean_text(dedupe_key, MAX_IDEMPOTENCY_KEY_LEN):
        raise Invalid("invalid_dedupe_key", f"dedupe_key must be 1..{MAX_IDEMPOTENCY_KEY_LEN} printable characters")
    return dedupe_rules.dedupe_key_of(tc.dedupe, idempotency_key, dedupe_key or "")


def _check_policy(name: Any, snap: config.Snapshot) -> None:
    """``unknown_retry_policy`` unless ``name`` is a RetryPolicy that exists."""
    if not isinstance(name, str) or name not in snap.policies:
        known = ", ".join(sorted(snap.policies)[:10]) or "none"
        raise Invalid("unknown_retry_policy", f"no retry policy named {shown(name, 80)} (known: {known})")


def out_of_memory(exc: redis.RedisError) -> bool:
    """Whether Redis refused for its ``maxmemory`` (``noeviction``): a script refused so had written nothing.

    Redis checks it at a script's first write (6.2) or before the script runs (7), never
    between two writes of one script; from inside a script the error is a ResponseError
    whose text carries the ``-OOM`` reply.
    """
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or "OOM command not allowed" in str(exc)


def unavailable(exc: redis.RedisError, task_id: str | None) -> DispatchResult:
    """``unavailable``, saying whether the admission script may have run.

    An error while connecting (or Redis still loading its data) means the script
    was never sent: nothing was written. Any other error (a timeout, a connection
    cut while waiting for the answer) leaves the outcome unknown: the task may be
    stored. Either way a caller retries with the same idempotency key, which
    returns the stored task if there is one and never makes a second.
    """
    if out_of_memory(exc):
        return DispatchResult(accepted=False, reason="unavailable",
                              detail="Redis is out of memory (its maxmemory is reached): nothing was written; "
                                     "retry later")
    never_sent = task_id is None or isinstance(exc, (redis.AuthenticationError, redis.BusyLoadingError)) or (
        isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) and "connecting to" in str(exc))
    if never_sent:
        detail = f"nothing was written: Redis unreachable ({exc}); retry later"
    else:
        detail = (f"outcome unknown: Redis did not answer ({exc}); the task may have been stored as {task_id}; "
                  "retry with the same idempotency key")
    return DispatchResult(accepted=False, reason="unavailable", detail=detail)


def interpret(reply: admit.Reply, prepared: Prepared, limits: dict[str, dict] | None = None,
              lane_share: int = owners.WHOLE_LANE_PCT) -> DispatchResult:
    """The ``DispatchResult`` admit.lua's ``reply`` (not ``Stale``) means for ``prepared``."""
    if not isinstance(reply, admit.Admitted):  # the common reply first: one check, not four
        return _not_admitted(reply, prepared, lane_share)
    tc, checked, task_id, now = prepared.tc, prepared.checked, prepared.task_id, prepared.now
    position, inputs = reply.position, reply.estimate
    limit = None
    if reply.waits_on:  # a limit did not admit it yet: its turn there bounds the wait
        name = reply.waits_on[len(keys.LIMIT_PREFIX):].split(":", 1)[0]
        limit = limit_wait(name, reply.waiting_ahead, (limits or {}).get(name), paused_for_s=reply.paused_ms / 1000)
    paused, consumers = inputs.paused, inputs.live_consumers
    estimated, why = estimate_delay(
        lane=tc.lane, ahead_in_lane=reply.ahead, ahead_in_chat=position - 1 if tc.chat_scoped else 0,
        completed=inputs.completed_this_minute + inputs.completed_previous_minute,
        busy_s=inputs.busy_s_this_minute + inputs.busy_s_previous_minute,
        window_s=60 + now % 60, paused=paused, consumers=consumers, limit=limit,
    )
    if consumers == 0 and not paused:
        why = no_consumer_detail(tc.lane)
    due = prepared.due
    if due is not None and not paused and consumers != 0:
        # Sent for later: it cannot start before it is due, nor before the work ahead of it
        # now (when that can be estimated: the lane may have drained by then).
        estimated, why = round(max(estimated or 0.0, due - now), 3), ""
    chat = checked.chat_id if tc.chat_scoped else ""
    result = DispatchResult(True, task_id, tc.lane, checked.priority, position, detail=why,
                            estimated_delay=estimated, chat_id=chat, store_result=tc.store_result,
                            replaced=reply.replaced or None)
    lifecycle.emit_queued(task_id, tc.name, tc.lane, chat)
    if reply.replaced:
        cancelling.settle_replaced(reply.replaced, reply.replaced_chat, dedupe_rules.replaced_detail(task_id),
                                   tc.name, tc.lane)
    return result


def _not_admitted(reply: admit.Reply, prepared: Prepared, lane_share: int) -> DispatchResult:
    """``interpret`` of a reply other than ``Admitted``: a duplicate, a conflict or a rejection."""
    tc, checked = prepared.tc, prepared.checked
    if isinstance(reply, admit.Duplicate):
        return DispatchResult(True, reply.task_id, tc.lane, checked.priority, duplicate=True,
                              store_result=tc.store_result)
    if isinstance(reply, admit.Conflict):
        return _rejected(
            tc.name, tc.lane, "idempotency_conflict",
            f"idempotency key {checked.idempotency_key!r} was used by task {reply.task_id} with another payload",
        )
    if isinstance(reply, admit.Rejected):
        reason = reply.reason
        detail = {
            "lane_closed": f"lane '{tc.lane}' is not accepting tasks",
            "lane_full": f"lane '{tc.lane}' holds {reply.depth} tasks, its capacity",
            "chat_queue_full": f"chat {checked.chat_id!r} already has {tc.chat_queue_size} queued messages",
        }.get(reason, reason)
        if reason == "caller_quota":
            detail = (f"this caller already holds its share of lane '{tc.lane}': {lane_share}% of the lane's "
                      "capacity in tasks not started yet; retry when some have started")
        return _rejected(tc.name, tc.lane, reason, detail)
    raise TypeError(f"interpret: no result for {reply!r}")
