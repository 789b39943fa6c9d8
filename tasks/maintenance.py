"""Background upkeep (``MaintenanceStep``, beat's thread): move due retries onto lanes,
publish tasks a limit admits again, expire waiting tasks past their deadline,
recover expired leases and leaked limit slots, purge old rows.

Each worker runs it in a thread, whatever lanes it consumes (every step covers
all lanes): retries are promoted and deadlines enforced within a fraction of a
second. Beat runs the same loop in a thread of its own, so upkeep goes on while
no worker is up, without sending a task message: a message every two seconds
flooded Flower's task list (pushing real tasks out of its history) and the log.
The loop is observable through its own counters instead (``lanes.metrics``,
``/metrics``). Every step is one idempotent Lua call, safe to run anywhere and
in many processes at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from celery import bootsteps, current_app, shared_task, states
from django.conf import settings

from lanes import metrics
from lanes.lua.audit import Repair
from lanes.lua.audit import audit as lua_audit
from lanes.lua.callers_audit import CallersAudited, audit_callers
from lanes.lua.expire import expire as lua_expire
from lanes.lua.forget import forget_expired_pending
from lanes.lua.limits_audit import LimitsAudited, audit_limits
from lanes.lua.limits_due import drain_due
from lanes.lua.promote import promote
from lanes.lua.reclaim import reclaim
from lanes.lua.sweep import sweep as lua_sweep
from lanes.messages import stored_parts
from lanes.models import LaneEvent
from lanes.redis_client import get_redis
from tasks import config, dead_letters
from tasks import signals as lifecycle
from tasks.errors import DeadLettered
from tasks.execution import tombstone_ttl_s

logger = logging.getLogger(__name__)
BATCH = 500
#: How many entries of a lane list expire.lua searches (from the consuming end) for an expired task's copy.
SWEEP_SEARCH_DEPTH = 1000
#: Most expired leases one sweep call looks at, and most calls per maintenance pass.
SWEEP_BATCH = 20
SWEEP_CALLS = 25
#: Most dead processes one reclaim call hands on (the rest at the next pass, 0.2 s later).
RECLAIM_PROCESSES = 20


def promote_due(lanes: list[str] | None = None) -> int:
    """Publish due retries of ``lanes`` (all configured lanes by default)."""
    names = lanes if lanes is not None else list(config.refresh_if_changed().lanes)
    now_ms = int(time.time() * 1000)
    lease_ms = int(settings.DISPATCH_QUEUED_LEASE_S * 1000)
    moved = 0
    for lane in names:
        moved += promote(lane=lane, now_ms=now_ms, batch=BATCH, queued_lease_ms=lease_ms)
    return moved


def drain_limits() -> int:
    """Publish tasks waiting on a limit whose bucket refilled or whose pause ended; returns instances drained."""
    return drain_due(now_ms=int(time.time() * 1000), batch=BATCH,
                     queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000))


def audit_limit_slots(batch: int = 200) -> LimitsAudited:
    """Free limit slots held by tasks that no longer run; see limits_audit.lua."""
    result = audit_limits(now_ms=int(time.time() * 1000), batch=batch,
                          queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000))
    if result.slots_freed:
        logger.warning("limit_audit_freed checked=%d freed=%d", *result)
    return result


def sweep() -> tuple[int, int]:
    """Republish tasks whose lease expired; returns (republished, forgotten).

    Small calls (``SWEEP_BATCH`` leases each, well under a millisecond of Redis
    time), repeated while they find a full batch, up to ``SWEEP_CALLS`` a pass:
    a backlog whose queued leases all ran out at once is parked in short slices
    that never hold Redis up for others (docs/liveness.md).
    """
    republished = forgotten = 0
    for _ in range(SWEEP_CALLS):
        swept = lua_sweep(now_ms=int(time.time() * 1000), batch=SWEEP_BATCH,
                          queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000))
        republished += swept.republished
        forgotten += swept.forgotten
        if swept.republished + swept.forgotten + swept.parked < SWEEP_BATCH:
            break
    if republished:
        logger.warning("sweep_republished count=%d", republished)
    return republished, forgotten


def reclaim_dead() -> int:
    """Hand on what dead worker processes held (docs/liveness.md); returns how many were republished.

    Cheap enough for every pass: one ZRANGEBYSCORE when no process died.
    """
    done = reclaim(now_ms=int(time.time() * 1000), max_processes=RECLAIM_PROCESSES,
                   queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000))
    if done.processes or done.republished:
        logger.warning("reclaimed_dead_processes processes=%d examined=%d republished=%d", done.processes,
                       done.examined, done.republished)
        if done.republished:
            logger.warning("sweep_republished count=%d", done.republished)
    return done.republished


def audit_chats(batch: int = 200, now_ms: int | None = None) -> list[int]:
    """Check a batch of active chats for a head that cannot move, and a batch of parked leases for a
    task whose copy was lost unclaimed, and repair them; see audit.lua.

    A task may be held for its type's attempt limit plus the lease before an owner that
    cannot move it (dead, unknown, no longer holding it; or a copy lost unclaimed)
    counts as stuck. Every repair is a bug somewhere else: it is logged, counted
    (``dispatch_chats_repaired_total``) and written to the lane's event log.
    """
    lease_ms = int(settings.DISPATCH_LEASE_S * 1000)
    held = {name: int(tc.attempt_timeout_s * 1000) + lease_ms for name, tc in config.current().types.items()}
    result = lua_audit(now_ms=int(time.time() * 1000) if now_ms is None else now_ms, batch=batch,
                       queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000), held_ms=held,
                       held_default_ms=max(held.values(), default=lease_ms))
    counts = [result.checked, result.handed_over, result.republished, result.dropped]
    if any(counts[1:]):
        logger.warning("chat_audit_repaired checked=%d handed_over=%d republished=%d dropped=%d", *counts)
    for repair in result.repairs:
        logger.error("task_repaired lane=%s chat=%r task=%s cause=%s", *repair)
    if result.repairs:
        _log_repairs(result.repairs)
    return counts


def audit_waiting_counts() -> CallersAudited:
    """Recount the lanes' waiting counts and their tokens' ones if one was lost; see callers_audit.lua.

    A count lost lets a token past its share (or holds it back) until it is recounted;
    each correction is logged, as every one is a count lost somewhere.
    """
    result = audit_callers(lanes=sorted(config.current().lanes))
    for fix in result.corrections:
        logger.warning("waiting_count_corrected lane=%s token=%s was=%d now=%d", *fix)
    return result


def _log_repairs(repairs: list[Repair]) -> None:
    """Each repair in its lane's event log (the dashboard's "Lane events"); never raises."""
    try:
        LaneEvent.objects.bulk_create([
            LaneEvent(lane=r.lane[:64], action="chat_repaired", actor="audit",
                      detail=(f"chat {r.chat!r}: head " if r.chat else "task ")
                      + f"{r.task_id} moved on ({r.cause}: {REPAIR_CAUSES.get(r.cause)})")
            for r in repairs])
    except Exception:  # the repair is done; a note that could not be written never stops maintenance
        logger.warning("chat_repair_event_failed repairs=%d", len(repairs), exc_info=True)


#: What each repair cause means, for the event log.
REPAIR_CAUSES = {
    "vanished": "its record was gone",
    "cancelled": "it was cancelled but still the head",
    "no_lease": "it had no lease",
    "lost_copy": "queued, its copy taken by a worker and lost unclaimed",
    "owner_dead": "its owner's process is dead",
    "owner_gone": "its owner's process is unknown",
    "not_running": "its owner no longer holds it",
}


#: What an expired waiting task's result says (``DispatchResult.get()`` raises it as DeadLettered).
EXPIRED_DETAIL = "deadline passed while the task waited: no worker started it in time"
#: Seconds before rows a maintenance run took but did not confirm are written again by any run.
EXPIRED_ROWS_RETRY_S = 30.0


def expire_due(batch: int = BATCH) -> int:
    """Turn waiting tasks whose deadline passed into ``expired`` dead letters; returns how many.

    The order that keeps this safe when the process dies midway is in
    expire.lua's header: Redis first (atomic, the record kept as pending), the
    rows next (idempotent), then the records are settled.
    """
    error = DeadLettered.because("expired", EXPIRED_DETAIL)
    expired = lua_expire(
        now=time.time(), batch=batch, result_json=json.dumps(str(error)), tombstone_ttl_s=tombstone_ttl_s(),
        queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
        retry_rows_ms=int(EXPIRED_ROWS_RETRY_S * 1000), search_depth=SWEEP_SEARCH_DEPTH,
    )
    written = []
    for task in expired:
        try:
            _write_expired_rows(task.record, task.message, error)
        except Exception:  # its entry stays pending: a later run writes the rows
            logger.warning("expired_rows_failed record=%s", task.record, exc_info=True)
            continue
        written.append(task.record)
    if written:
        forget_expired_pending(written)
        logger.warning("expired_waiting count=%d", len(written))
    return len(written)


def parse_stored_message(msg: bytes, record: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(task id, payload, envelope dict) of the message stored in ``record`` (lanes.messages)."""
    if msg[:1] == b"{":  # written before messages were stored compact
        outer = json.loads(msg.replace(b"\0", b"").decode("utf-8"))
        _args, kwargs, _embed = json.loads(outer["body"])
        return outer["headers"]["id"], kwargs.get("payload"), kwargs.get("dispatch") or {}
    _handler, _hard, _soft, payload_json, envelope_json = stored_parts(msg)
    return record.rsplit(":", 1)[-1], json.loads(payload_json), json.loads(envelope_json)


def _write_expired_rows(record: str, msg: bytes, error: DeadLettered) -> None:
    task_id, payload, env = parse_stored_message(msg, record)
    dead_letters.record(
        task_id=task_id, task_type=str(env.get("type", "")), lane=str(env.get("lane", "")), reason="expired",
        payload=payload if isinstance(payload, dict) else None, chat_id=str(env.get("chat") or ""),
        idempotency_key=str(env.get("key") or ""), metadata=env.get("meta") or None,
        priority=int(env.get("priority", 5)), attempts=int(env.get("attempt", 1)),
        dispatched_at=env.get("dispatched_at"), message=EXPIRED_DETAIL,
    )
    current_app.backend.store_result(task_id, error, states.FAILURE)
    dispatched_at = env.get("dispatched_at")
    queued_s = time.time() - dispatched_at if isinstance(dispatched_at, (int, float)) else None
    lifecycle.emit(lifecycle.task_finished, lambda: lifecycle.TaskInfo(
        task_id, str(env.get("type", "")), str(env.get("lane", "")), str(env.get("chat") or ""),
        int(env.get("attempt", 1)), queued_s, None, outcome="dead", reason="expired", detail=EXPIRED_DETAIL))


def run_once(sweep_now: bool) -> dict[str, Any]:
    """One pass of the loop: promote, expire, and (every few seconds) sweep and audit; counted."""
    done: dict[str, Any] = {"promoted": promote_due(), "limits_drained": drain_limits(), "expired": expire_due(),
                            "reclaimed": reclaim_dead()}
    if sweep_now:
        done["swept"], _forgotten = sweep()
        done["audited"] = audit_chats()
        done["limits_audited"] = audit_limit_slots()
        done["counts_audited"] = audit_waiting_counts()
    metrics.record_maintenance(get_redis(), time.time(), promoted=done["promoted"], expired=done["expired"],
                               swept=done.get("swept", 0) + done["reclaimed"])
    return done


@shared_task(name="tasks.maintenance", ignore_result=True)
def maintenance() -> dict:
    """One pass, by hand (``celery call tasks.maintenance``); beat no longer sends it."""
    return run_once(sweep_now=True)


@shared_task(name="tasks.purge_dead_letters", ignore_result=True)
def purge_dead_letters() -> int:
    return dead_letters.purge_resolved()


def loop(stopping: threading.Event) -> None:
    """Run passes every ``DISPATCH_PROMOTE_INTERVAL_S`` until ``stopping`` is set."""
    interval = settings.DISPATCH_PROMOTE_INTERVAL_S
    sweep_every = max(1.0, min(settings.DISPATCH_LEASE_S, settings.DISPATCH_QUEUED_LEASE_S) / 4)
    next_sweep = 0.0
    while not stopping.wait(interval):
        try:
            sweep_now = time.monotonic() >= next_sweep
            run_once(sweep_now)
            if sweep_now:
                next_sweep = time.monotonic() + sweep_every
        except Exception:
            logger.warning("maintenance_failed", exc_info=True)
            stopping.wait(1.0)


def start_thread(name: str = "dispatch-maintenance") -> threading.Event:
    """Start the loop in a daemon thread; set the returned event to stop it."""
    stopping = threading.Event()
    threading.Thread(target=loop, args=(stopping,), name=name, daemon=True).start()
    return stopping


class MaintenanceStep(bootsteps.StartStopStep):
    """A worker thread that promotes due retries, expires waiting tasks and sweeps expired leases."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, **kwargs):
        self.stopping: threading.Event | None = None

    def start(self, worker) -> None:
        self.stopping = start_thread()

    def stop(self, worker) -> None:
        if self.stopping is not None:
            self.stopping.set()


def maintain_in_beat(**_: Any) -> None:
    """Receiver of ``beat_init`` (``tasks.receivers``): beat keeps upkeep going while no worker
    is up, in a thread: no task message."""
    start_thread("dispatch-maintenance-beat")
    logger.info("maintenance_in_beat interval=%.1fs", settings.DISPATCH_PROMOTE_INTERVAL_S)
