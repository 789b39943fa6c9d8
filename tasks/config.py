"""The live configuration: lanes, retry policies and task types, cached per process.

Every Lua call at dispatch and at execution compares the cached version with
the one in Redis (bumped on each admin save), so a change is seen by the next
call without polling and without restarts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import cast

import redis
from django.db import DatabaseError

from lanes import keys
from lanes.forksafe import ForkSafeLock
from lanes.lua.limits_def import publish_definitions
from lanes.redis_client import get_redis, time_left
from tasks.retry import Backoff


@dataclass(frozen=True)
class LaneConf:
    name: str
    capacity: int
    accepting: bool


@dataclass(frozen=True)
class LimitRef:
    """A limit a type names, with what dispatch needs to build its instance (scope)."""

    name: str
    scope: str  # global | chat | key


@dataclass(frozen=True)
class TypeConf:
    name: str
    handler: str
    lane: str
    priority: int
    timeout_s: float
    attempt_timeout_s: float
    chat_scoped: bool
    chat_queue_size: int
    max_payload_bytes: int
    idempotency_window_s: int
    enabled: bool
    options: dict
    policy: Backoff
    #: Batched handlers: most tasks per handler call, and how long to wait to fill a batch.
    batch_size: int = 1
    batch_window_ms: int = 0
    #: The type's limits, in its order (empty: the unlimited path, no limit work at all).
    limits: tuple[LimitRef, ...] = ()
    #: Chat ids, idempotency and limit keys common to every API caller (not namespaced per token).
    shared: bool = False
    #: Longest countdown / eta an API caller may ask (None: the type's timeout).
    max_delay_s: float | None = None
    #: Which outcomes get a result row: 'always', 'failures' (dead letters and cancels) or 'never'.
    store_result: str = "always"
    #: 'key', 'throttle' or 'debounce' (``tasks.dedupe``), and its window in seconds.
    dedupe: str = "key"
    dedupe_window_s: float = 0.0

    @property
    def needs_limit_key(self) -> bool:
        return any(ref.scope == "key" for ref in self.limits)


@dataclass(frozen=True)
class Snapshot:
    version: str
    lanes: dict[str, LaneConf] = field(default_factory=dict)
    types: dict[str, TypeConf] = field(default_factory=dict)
    #: Limit name -> its definition as the scripts read it (``Limit.as_def``).
    limits: dict[str, dict] = field(default_factory=dict)
    #: The database's ConfigRevision when this was read (-1: unknown).
    db_revision: int = -1
    #: Retry policy name -> its backoff (a dispatch's ``retry_policy`` names one).
    policies: dict[str, Backoff] = field(default_factory=dict)


logger = logging.getLogger(__name__)

#: Seconds between two comparisons of the cached configuration with the
#: database's revision: the bound on how long a change whose Redis bump was lost
#: stays unseen (one small query per process per interval).
DB_CHECK_INTERVAL_S = 5.0

_lock = ForkSafeLock()
_snapshot: Snapshot | None = None
_next_db_check = 0.0


def _db_revision() -> int:
    from lanes.models import ConfigRevision  # inner import: tasks.dispatch imports this before apps are ready

    return ConfigRevision.objects.filter(pk=1).values_list("revision", flat=True).first() or 0


def _load(version: str) -> Snapshot:
    # inner import: tasks.dispatch imports this module, and callers may import it before apps are ready
    from lanes.models import Lane
    from tasks.models import Limit, RetryPolicy, TaskType, TaskTypeLimit

    db_revision = _db_revision()  # first: a save racing this read shows as a newer revision
    lanes = {lane.name: LaneConf(lane.name, lane.capacity, lane.accepting) for lane in Lane.objects.all()}
    limits = {limit.name: limit.as_def() for limit in Limit.objects.all()}
    policies = {rp.name: _backoff(rp) for rp in RetryPolicy.objects.all()}
    type_limits: dict[int, list[LimitRef]] = {}
    for row in TaskTypeLimit.objects.select_related("limit").order_by("task_type_id", "position", "id"):
        type_limits.setdefault(row.task_type_id, []).append(LimitRef(row.limit.name, row.limit.scope))
    types = {}
    for tt in TaskType.objects.select_related("lane", "retry_policy"):
        rp = tt.retry_policy
        types[tt.name] = TypeConf(
            name=tt.name,
            handler=tt.handler,
            lane=tt.lane.name,
            priority=tt.priority,
            timeout_s=tt.timeout,
            attempt_timeout_s=tt.attempt_timeout,
            chat_scoped=tt.chat_scoped,
            chat_queue_size=tt.chat_queue_size,
            max_payload_bytes=tt.max_payload_bytes,
            idempotency_window_s=tt.idempotency_window,
            enabled=tt.enabled,
            options=dict(tt.options or {}),
            policy=_backoff(rp),
            limits=tuple(type_limits.get(tt.pk, ())),
            batch_size=tt.batch_size,
            batch_window_ms=tt.batch_window_ms,
            shared=tt.shared,
            max_delay_s=tt.max_delay,
            store_result=tt.store_result,
            dedupe=tt.dedupe,
            dedupe_window_s=tt.dedupe_window,
        )
    _publish_limits(limits)
    return Snapshot(version, lanes, types, limits, db_revision, policies)


def _backoff(rp) -> Backoff:
    return Backoff(rp.max_retries, rp.initial_backoff, rp.multiplier, rp.max_backoff, rp.jitter)


def _publish_limits(limits: dict[str, dict]) -> None:
    """Write the limits' definitions where the scripts read them (idempotent: any process may).

    Every reload writes them, so an admin edit reaches the gate as soon as any
    process (a maintenance loop reloads within its interval) sees the new
    version; instances of a limit that changed are drained at once.
    """
    try:
        publish_definitions(limits, now=time.time())
    except redis.RedisError as exc:  # the next reload (any process) writes them again
        logger.warning("limit_definitions_not_published error=%r", exc)


def current() -> Snapshot:
    snap = _snapshot
    if snap is None:
        snap = reload(missing_only=True)
    elif time.monotonic() >= _next_db_check:
        snap = _check_db(snap)
    return snap


def _check_db(snap: Snapshot) -> Snapshot:
    """Reload when the database's revision moved without a Redis bump reaching us."""
    global _next_db_check, _snapshot
    _next_db_check = time.monotonic() + DB_CHECK_INTERVAL_S
    try:
        revision = _db_revision()
    except DatabaseError as exc:
        logger.debug("config_db_check_skipped error=%r", exc)
        return snap
    if revision == snap.db_revision:
        return snap
    logger.info("config_changed_in_db revision=%s cached=%s", revision, snap.db_revision)
    with _lock:
        if _snapshot is not None and _snapshot.db_revision == snap.db_revision:
            _snapshot = _load(snap.version)
        return _snapshot or snap


def reload(version: str | None = None, *, missing_only: bool = False) -> Snapshot:
    """Read the configuration again (the version first, so a racing save shows as stale).

    The read holds the lock while Redis answers; a call under a deadline
    (``lanes.redis_client.deadline``) waits for the lock only until then. Otherwise,
    with Redis frozen, the calls of a process with no snapshot yet (one started
    during the freeze) queued on it and each read in turn: the last waited the
    whole freeze. ``missing_only``: one that finds a snapshot loaded meanwhile uses it.
    """
    global _snapshot, _next_db_check
    left = time_left()
    if not _lock.acquire(timeout=-1 if left is None else max(0.0, left)):
        raise redis.TimeoutError("Timeout waiting for another call reading the configuration from Redis")
    try:
        if missing_only and _snapshot is not None:
            return _snapshot
        if version is None or _snapshot is None or _snapshot.version != version:
            _next_db_check = time.monotonic() + DB_CHECK_INTERVAL_S
            stored = cast("bytes | None", get_redis().get(keys.CONFIG_VERSION))
            _snapshot = _load(stored.decode() if stored else "0")
        return _snapshot
    finally:
        _lock.release()


def ensure(version: str) -> Snapshot:
    """The snapshot for ``version`` as reported by Redis, reloading if ours is older."""
    snap = current()
    if snap.version != version:
        snap = reload(version)
    return snap


def forget() -> None:
    global _snapshot
    with _lock:
        _snapshot = None


def refresh_if_changed() -> Snapshot:
    """Compare with the version in Redis (one GET) and reload when it moved."""
    version = cast("bytes | None", get_redis().get(keys.CONFIG_VERSION))
    return ensure(version.decode() if version else "0")
