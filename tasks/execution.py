"""Running one delivered task: ``HandlerTask``, the base of every handler's Celery task.

claim (start.lua) -> deadline check -> handler with a time limit -> one of:
success (finish.lua hands the chat on), retry (retry.lua parks the next
attempt in Redis), or dead letter (row, then finish.lua). Every step is one
Redis call; the only SQL on the success path is Celery's result row, after
which the finished record is settled (batched: lanes.leases).

The lease is held from the claim until the outcome is in Redis, and an outcome
call that Redis did not answer is sent again (both scripts are safe to run
twice): a handler whose effect happened must not be reported as failed, nor
run again, because Redis stalled for a moment after it.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn, cast

import redis
from billiard.exceptions import SoftTimeLimitExceeded
from celery import Task, states
from celery.exceptions import Ignore, Retry
from django.conf import settings

from lanes import counters, keys, leases, metrics
from lanes.histogram import bucket_label
from lanes.lua.finish import finish as lua_finish
from lanes.lua.loader import ReplicaAcksMissing
from lanes.lua.retry import retry as lua_retry
from lanes.lua.start import start as lua_start
from lanes.messages import Envelope, build_message
from lanes.redis_client import get_redis
from tasks import config, dead_letters, history, results, tracing, validation
from tasks import signals as lifecycle
from tasks.context import Context
from tasks.errors import AttemptTimeout, DeadLettered, NonRetryableError, RetryableError, TaskCancelled
from tasks.links import dead_letter_admin_url
from tasks.retry import Backoff, decide_retry
from tasks.validation import encode_json

logger = logging.getLogger(__name__)


class HandlerTask(Task):
    """Base of every registered handler: runs the platform's steps around it."""

    typing = False
    acks_late = True
    #: On a thread-pool worker, plain handlers' platform messages run in groups (tasks.grouping).
    Strategy = "tasks.grouping:strategy"
    handler_func = None
    #: Set for a batched handler (``@handler(..., batch=True)``, bound on tasks.batching.BatchHandlerTask).
    batched = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return execute(self, args, kwargs)

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        # Celery calls this once the result row is stored: the finished record
        # may go (lanes.leases.LeaseBook.settle). When the row could not be stored (no
        # call here) or a failure to store it was stored instead (another
        # state), the record stays: its lease runs out and a copy stores the row.
        settle = getattr(self.request, "dispatch_settle", None)
        if settle and settle[1] == status:
            leases.current().settle(settle[0])


def _malformed(task: Task, detail: str, payload: Any, raw: Any) -> NoReturn:
    env = raw if isinstance(raw, dict) else {}
    _record_dead_letter(
        task_id=task.request.id or "unknown", task_type=str(env.get("type", task.name))[:100],
        lane=str(env.get("lane", ""))[:64], reason="malformed", payload=payload if isinstance(payload, dict) else None,
        message=f"malformed message: {detail}", attempts=0,
    )
    raise DeadLettered.because("malformed", detail, task_type=str(env.get("type", task.name))[:100],
                               admin_url=dead_letter_admin_url(task.request.id or "unknown"))


def execute(task: Task, args: tuple, kwargs: dict,
            runner: Callable[[Task, Envelope, dict], Any] | None = None) -> Any:
    """Check the message's arguments, then run it (``runner``: a batched handler's, tasks.batching)."""
    payload, raw_env = kwargs.get("payload"), kwargs.get("dispatch")
    if args or set(kwargs) - {"payload", "dispatch"}:
        _malformed(task, "unexpected arguments", payload, raw_env)
    try:
        env = Envelope.from_dict(raw_env)
    except (TypeError, ValueError) as exc:
        _malformed(task, str(exc), payload, raw_env)
    if not isinstance(payload, dict):
        _malformed(task, "payload is not an object", payload, raw_env)
    try:
        if runner is not None:
            return runner(task, env, payload)
        attempt = Attempt(task, env, payload)
        try:
            return attempt.run()
        finally:
            tracing.end_attempt(attempt)  # its span, when no outcome ended it (a skipped claim, an error)
    except Finished as finished:
        return finished.result


class Finished(Exception):
    def __init__(self, result: Any) -> None:
        self.result = result


class Attempt:
    """One attempt of one delivered task, from its claim to its outcome in Redis: the owner of its lease.

    ``run`` is the whole single path (Celery's request calls it through ``execute``); a
    group of plain tasks (``tasks.grouping``) and a batch (``tasks.batching``) claim their
    attempts together, then take the same steps: ``begin``, the handler, and the outcome
    (``finish_done`` here, or ``finish_batch`` for many; ``failed`` / ``die`` for the rest).
    Its lease is kept in ``book``, the process's (``lanes.leases.LeaseBook``), from the
    claim to the settle.
    """

    def __init__(self, task: Task, env: Envelope, payload: dict, task_id: str | None = None,
                 request: Any = None, book: leases.LeaseBook | None = None) -> None:
        # ``task_id``/``request``: an item a group or batch claimed has its own id, and a request
        # of its own where the outcome to store is noted.
        self.book = book if book is not None else leases.current()
        self.task = task
        self.env = env
        self.payload = payload
        self.task_id: str = task_id or task.request.id
        self.request = request if request is not None else task.request
        self.record = keys.task_record(self.task_id, env.chat or None)
        self.field = f"{env.lane}|{env.type}"
        self.started_at = 0.0
        self.owner = ""  # set by a successful claim
        self.span: Any = None  # the attempt's span while tracing is on (tasks.tracing)

    # -- steps -------------------------------------------------------------
    def run(self) -> Any:
        version = self.claim(time.time())
        tc, ctx, limit = self.begin(version)
        self.book.hold(self.record)
        try:
            result, result_json = self._attempt(tc, ctx, limit)
            self.finish_done(result_json)
        finally:
            self.book.release(self.record)
        return result

    def begin(self, version: str, now: float | None = None) -> tuple[config.TypeConf, Context, float]:
        """After the claim: the type in force, the deadline check, the handler's context and time limit.

        Dead-letters (raises ``DeadLettered``) a task whose type is gone or whose deadline passed.
        """
        env = self.env
        now = time.time() if now is None else now
        tracing.start_attempt(self, now)
        snap = config.ensure(version)
        tc = snap.types.get(env.type)
        if tc is None:
            self.die("malformed", f"unknown task type '{env.type}'")
        if tc.handler != self.task.name:
            logger.info("handler_changed task=%s type=%s now=%s", self.task_id, env.type, tc.handler)
        if now >= env.deadline:
            self.die("expired", f"deadline passed {now - env.deadline:.3f}s before the attempt could start")
        self.started_at = now
        history.started(self.task_id, env, getattr(self.request, "hostname", None) or leases.process_id(), now)
        limit = min(tc.attempt_timeout_s, env.deadline - now)
        ctx = Context(
            task_id=self.task_id, type=env.type, lane=env.lane, chat_id=env.chat, attempt=env.attempt,
            deadline=env.deadline, attempt_deadline=now + limit, idempotency_key=env.key or self.task_id,
            metadata=env.meta or {}, options=tc.options, _record=self.record,
        )
        lifecycle.emit(lifecycle.task_started, lambda: self.info(now))
        return tc, ctx, limit

    def finish_done(self, result_json: str) -> None:
        """The attempt succeeded: its outcome in Redis (finish.lua), the chat handed on."""
        self._finish("done", result_json, "")
        self.emit_finished(time.time())

    def emit_finished(self, finished_at: float) -> None:
        """The lifecycle signal of a success recorded in Redis (``tasks.signals.task_finished``), its history
        and its span."""
        history.ended(self.task_id, self.env.attempt, "succeeded", at=finished_at)
        tracing.outcome(self, "succeeded")
        lifecycle.emit(lifecycle.task_finished, lambda: self.info(finished_at, outcome="succeeded"))

    def _attempt(self, tc: config.TypeConf, ctx: Context, limit: float) -> tuple[Any, str]:
        try:
            with time_limit(limit, self.request), tracing.handler_span(self):
                returned = self.task.handler_func(self.payload, ctx)
        except SoftTimeLimitExceeded as exc:
            return self.outcome_of(tc, AttemptTimeout(f"attempt ran past its {limit:.3f}s limit"), cause=exc)
        except BaseException as exc:  # noqa: BLE001 - contain SystemExit/KeyboardInterrupt from handlers too
            return self.outcome_of(tc, exc)
        return self.outcome_of(tc, returned)

    def outcome_of(self, tc: config.TypeConf, returned: Any,
                   cause: BaseException | None = None) -> tuple[Any, str]:
        """What the handler's return (a value, or the exception it raised) means: the value and its JSON
        for a success; otherwise the failure's steps run here (retry, dead letter, cancel) and raise
        what Celery would see (``Retry``, ``DeadLettered``, ``Ignore``)."""
        exc = returned if isinstance(returned, BaseException) else None
        if exc is None:
            try:
                return returned, json.dumps(returned)
            except BaseException as encode_error:  # noqa: BLE001 - as a handler's own error
                exc = encode_error
        if isinstance(exc, TaskCancelled):
            self._end_cancelled(self._cancel_detail() or str(exc))
        if isinstance(exc, NonRetryableError):
            self.die("non_retryable", str(exc), exc)
        if isinstance(exc, TypeError) and "not JSON serializable" in str(exc):
            self.die("non_retryable", f"handler returned a value that is not JSON: {exc}", exc)
        self.failed(tc, exc, cause=cause)

    def claim(self, now: float) -> str:
        """Take the task's lease (start.lua); returns the config version in force.

        A task that is not this attempt's to run raises what Celery should see: ``Ignore``
        (skipped, cancelled, unconfirmed), ``Finished`` (already done: its row stored again),
        ``DeadLettered`` (already dead, or poison).
        """
        env = self.env
        popped = self.book.take_claimed_at_pop(self.record)
        if popped is not None:  # the pop claimed it (lanes.transport); ``run`` holds its lease from here
            self.book.release(self.record)
            return self.claimed_at_pop(popped.owner, popped.config_version, now)
        dead_owner = ""
        owner = leases.owner_id()
        qlat = now - env.ready_at  # a task sent for later is waited for from its due time
        for _ in range(2):
            try:
                # Sent again while Redis does not answer (the claim may have run): a second run by the same
                # owner answers 'run' again. Given up on, the task failed and was acked with its message
                # popped and unclaimed: a head no process held, until the audit found it (FAULTS.md, 14).
                started = until_answered(functools.partial(
                    lua_start,
                    task_id=self.task_id, record=self.record, chat=env.chat, attempt=env.attempt, owner=owner,
                    now=now, dead_owner=dead_owner, metric_field=self.field,
                    queue_latency_bucket=bucket_label(qlat) if env.attempt == 1 else "", queue_latency_s=qlat,
                    **claim_terms(self.book),
                ), "claim", self.task_id)
            except ReplicaAcksMissing as exc:
                # Claimed on a master whose replicas lag: a failover now could forget
                # the task and its caller send it again. Not run; the claim's lease
                # runs out and the sweep sends it again once replicas keep up.
                logger.warning("claim_unconfirmed task=%s error=%s: not run; its lease brings it back",
                               self.task_id, exc)
                raise Ignore() from exc
            status = started.status
            if status == "run":
                self.owner = owner
                self.book.keep_alive()  # beats from now on: this process holds a claim
                return started.config_version
            if status == "busy" and leases.owner_is_dead_here(started.detail):
                dead_owner = started.detail
                continue
            break
        if status == "finished":
            # Finished, but its worker may have died before Celery stored the
            # outcome: store it again (the result row is written idempotently).
            outcome, _, result_json = started.detail.partition("|")
            if outcome == "cancelled":
                # Cancelled while waiting (cancel.lua): dropped, never run; the row says so.
                results.store_revoked(self.task_id, _text(result_json), request=self.request)
                self.book.settle(self.record)
                logger.info("cancelled_copy_dropped task=%s", self.task_id)
                raise Ignore()
            self.request.dispatch_settle = (self.record, ROW_STATE[outcome])
            logger.info("redelivery_of_finished task=%s outcome=%s", self.task_id, outcome)
            if outcome == "done":
                raise Finished(json.loads(result_json))
            raise DeadLettered(json.loads(result_json) or "dead letter")
        if status == "poison":
            self.die("poison", f"delivered {started.deliveries - 1} times; its worker died each time before finishing")
        logger.info("delivery_skipped task=%s status=%s", self.task_id, status)
        raise Ignore()

    def claimed_at_pop(self, owner: str, version: str, now: float) -> str:
        """The pop claimed this attempt for ``owner`` (``pop_more.lua``, as ``start.lua`` would have): counted as
        a claim is (started, queue latency); returns the config version in force."""
        self.owner = owner
        qlat = now - self.env.ready_at
        counters.add(f"started|{self.field}", now)
        counters.observe("qlat", self.field, bucket_label(qlat) if self.env.attempt == 1 else "", qlat, now)
        return version

    def failed(self, tc: config.TypeConf, exc: BaseException, cause: BaseException | None = None) -> NoReturn:
        """The attempt failed with ``exc``: retried (retry.lua, raises ``Retry``) or dead by its policy."""
        env = self.env
        now = time.time()
        retry_after = exc.retry_after_s if isinstance(exc, RetryableError) else None
        decision = decide_retry(_policy(tc, env.policy), env.attempt, now, env.deadline, retry_after)
        if not decision.retry:
            detail = f"{type(exc).__name__}: {exc}"
            self.die(decision.reason, detail, exc)
        next_env = replace(env, attempt=env.attempt + 1, trace=tracing.next_trace(self, now + decision.delay_s))
        soft_limit = min(tc.attempt_timeout_s, max(0.001, env.deadline - now))
        message = build_message(self.task_id, tc.handler, encode_json(self.payload), next_env, soft_limit)
        retried = until_answered(lambda: lua_retry(
            record=self.record, lane=env.lane, now=now, next_attempt=next_env.attempt, message=message,
            due=now + decision.delay_s, queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
            metric_field=self.field, owner=self.owner, retry_after_s=retry_after,
        ), "retry", self.task_id)
        if retried.status == "cancelled":
            self._end_cancelled(retried.detail)
        if retried.status != "ok":
            logger.warning("retry_skipped task=%s status=%s state=%s", self.task_id, retried.status, retried.detail)
            raise Ignore()
        history.ended(self.task_id, env.attempt, "retry", at=now, error=f"{type(exc).__name__}: {exc}"[:500],
                      delay_s=round(decision.delay_s, 3))
        logger.info("retry_scheduled task=%s attempt=%d delay=%.3fs error=%r",
                    self.task_id, env.attempt, decision.delay_s, exc)
        tracing.outcome(self, "retrying", reason=type(exc).__name__, detail=str(exc), retry_delay_s=decision.delay_s)
        lifecycle.emit(lifecycle.task_finished, lambda: self.info(now, outcome="retrying", reason=type(exc).__name__,
                                                           detail=str(exc)))
        raise Retry(str(exc) or type(exc).__name__, exc=portable_exception(exc), when=decision.delay_s)

    def die(self, reason: str, detail: str, exc: BaseException | None = None) -> NoReturn:
        """The task ends dead: its dead-letter row, then finish.lua; raises ``DeadLettered``."""
        env = self.env
        # The task ends dead in Redis whether or not its row could be written: a row
        # that cannot be stored must not leave the task running (redelivered, run
        # again, poison, the same failure, forever).
        tracing.dead_letter(self, reason, detail)
        _record_dead_letter(
            task_id=self.task_id, task_type=env.type, lane=env.lane, reason=reason, payload=self.payload,
            chat_id=env.chat, idempotency_key=env.key, metadata=env.meta, priority=env.priority,
            attempts=env.attempt, dispatched_at=env.dispatched_at, exc=exc, message=detail,
        )
        failure = DeadLettered.because(reason, detail, task_type=env.type,
                                       admin_url=dead_letter_admin_url(self.task_id))
        self._finish("dead", json.dumps(str(failure)), reason)
        tracing.outcome(self, "dead", reason=reason, detail=detail)
        died_at = time.time()
        history.ended(self.task_id, env.attempt, "dead", at=died_at, reason=reason, error=detail[:500])
        lifecycle.emit(lifecycle.task_finished,
                       lambda: self.info(died_at, outcome="dead", reason=reason, detail=detail))
        raise failure

    def _cancel_detail(self) -> str:
        try:
            flag = cast("bytes | None", get_redis().hget(self.record, "cx"))
        except redis.RedisError:
            return ""
        return flag.decode(errors="replace") if flag else ""

    def _end_cancelled(self, detail: str) -> NoReturn:
        """A running task told of a cancel stopped (its handler raised TaskCancelled, or it failed and
        would have been retried): it ends cancelled, its chat moves on, its row says REVOKED."""
        detail = detail or "cancelled"
        self._finish("cancelled", json.dumps(detail), "cancelled")
        tracing.outcome(self, "cancelled", reason="cancelled", detail=detail)
        results.store_revoked(self.task_id, detail, request=self.request)
        self.book.settle(self.record)
        results.announce_revoked(self.task_id)
        ended_at = time.time()
        history.ended(self.task_id, self.env.attempt, "cancelled", at=ended_at, detail=detail[:500])
        lifecycle.emit(lifecycle.task_finished,
                       lambda: self.info(ended_at, outcome="cancelled", reason="cancelled", detail=detail))
        logger.info("task_cancelled_running task=%s detail=%r", self.task_id, detail)
        raise Ignore()

    def _finish(self, outcome: str, result_json: str, reason: str) -> None:
        env = self.env
        now = time.time()
        xlat = now - self.started_at if self.started_at else None
        finished = until_answered(lambda: lua_finish(
            task_id=self.task_id, record=self.record, chat=env.chat, outcome=outcome,
            result_json=bounded_result(result_json), now=now, tombstone_ttl_s=tombstone_ttl_s(),
            queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000), metric_field=self.field, reason=reason,
            execution_latency_bucket=bucket_label(xlat) if xlat is not None else "",
            execution_latency_s=xlat or 0, owner=self.owner, settle_lease_ms=int(settings.DISPATCH_LEASE_S * 1000),
        ), "finish", self.task_id)
        if finished.status == "taken":
            # Our lease ran out while Redis was away and another worker claimed the
            # task: its attempt records the outcome; this one stores nothing.
            logger.warning("finish_skipped task=%s taken_by=%s", self.task_id, finished.detail)
            raise Ignore()
        self.request.dispatch_settle = (self.record, ROW_STATE[outcome])

    def info(self, now: float, **extra: Any) -> lifecycle.TaskInfo:
        """What the lifecycle signals carry about this attempt at ``now``."""
        env = self.env
        qlat = (self.started_at or now) - env.ready_at
        xlat = now - self.started_at if self.started_at and extra.get("outcome") else None
        return lifecycle.TaskInfo(self.task_id, env.type, env.lane, env.chat, env.attempt, qlat, xlat, **extra)


def claim_terms(book: leases.LeaseBook) -> dict[str, Any]:
    """What every claim sends besides its tasks (``start.lua``'s one, a group's ``claim_group.lua``): the lease,
    the delivery cap, and the claiming process with its liveness entry's lifetime until ``book``'s first beat."""
    return {"lease_ms": int(settings.DISPATCH_LEASE_S * 1000), "max_deliveries": settings.DISPATCH_MAX_DELIVERIES,
            "process": leases.process_id(), "liveness_ms": book.liveness_ms()}


def _policy(tc: config.TypeConf, name: str) -> Backoff:
    """The retry policy the caller named at dispatch, else (none, or removed since) the type's."""
    if not name:
        return tc.policy
    return config.current().policies.get(name, tc.policy)


def _record_dead_letter(**row: Any) -> None:
    """Write the dead-letter row; never raise.

    If the row is refused (text the database cannot hold, a constraint, a
    trigger), write it again with every free-form value replaced by an escaped
    repr and a note saying so; if that fails too, log loudly with the task id
    and count ``dead_letter_write_failures`` for the operator's alerts.
    """
    try:
        dead_letters.record(**row)
        return
    except Exception as exc:  # noqa: BLE001 - the task must still end (see Attempt.die)
        first = exc
        logger.error("dead_letter_write_failed task=%s error=%r; retrying with escaped values", row["task_id"], exc)
    original = row.pop("exc", None)
    note = (f"[dead-letter row refused as written ({type(first).__name__}: {first}); payload and metadata "
            f"kept as escaped text] ")
    safe: dict[str, Any] = {
        **{k: validation.scrub_text(v) if isinstance(v, str) else v for k, v in row.items()},
        "payload": {"unstorable_payload": validation.scrub_text(repr(row.get("payload")))[:100_000]},
        "metadata": {"unstorable_metadata": validation.scrub_text(repr(row.get("metadata")))[:10_000]},
        "message": validation.scrub_text(note + (row.get("message") or (str(original) if original else ""))),
    }
    try:
        dead_letters.record(**safe)
        return
    except Exception as again:  # noqa: BLE001
        logger.critical("dead_letter_lost task=%s type=%s lane=%s reason=%s error=%r: the task ends dead "
                        "in Redis with no dead-letter row", row["task_id"], row["task_type"], row["lane"],
                        row["reason"], again)
    try:
        metrics.count_dead_letter_write_failure(get_redis(), row["lane"], row["task_type"])
    except redis.RedisError as exc2:
        logger.error("dead_letter_write_failure_not_counted task=%s error=%r", row["task_id"], exc2)


#: The result row's state that records each outcome.
ROW_STATE = {"done": states.SUCCESS, "dead": states.FAILURE, "cancelled": states.REVOKED}

#: Redis errors after which a call may or may not have run.
_UNANSWERED = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def until_answered(call: Callable[[], Any], step: str, task_id: str) -> Any:
    """Send an outcome call again until Redis answers (for up to two leases).

    The worker still holds the task's lease (its heartbeat renews it once Redis
    is back), so no other worker takes the task over meanwhile; and if one did,
    the script says so instead of acting twice.
    """
    give_up = time.monotonic() + 2 * settings.DISPATCH_LEASE_S
    delay = 0.1
    while True:
        try:
            return call()
        except _UNANSWERED as exc:
            if time.monotonic() + delay > give_up:
                raise
            logger.warning("outcome_not_recorded_yet task=%s step=%s error=%r retry_in=%.1fs",
                           task_id, step, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


#: Largest result kept in a tombstone; a bigger one is re-stored as null.
TOMBSTONE_RESULT_MAX = 16384


def _text(result_json: str) -> str:
    """A stored detail (JSON text) back as text."""
    try:
        value = json.loads(result_json)
    except ValueError:
        return result_json
    return value if isinstance(value, str) else result_json


def bounded_result(result_json: str) -> str:
    return result_json if len(result_json) <= TOMBSTONE_RESULT_MAX else "null"


def tombstone_ttl_s() -> int:
    """Long enough to outlive any copy still in the broker (restore or sweep)."""
    return int(max(settings.DISPATCH_QUEUED_LEASE_S, 4 * settings.DISPATCH_LEASE_S))


def portable_exception(exc: BaseException) -> BaseException:
    """Celery stores the exception in the result backend: keep it JSON-friendly."""
    if isinstance(exc, Exception) and type(exc).__module__ in {"builtins", "tasks.errors"}:
        return exc
    return RetryableError(f"{type(exc).__name__}: {exc}")


class time_limit:
    """Stop the handler at ``limit_s`` when Celery's own soft limit would come later.

    Celery sets the soft limit from the message (computed at publish); time spent
    waiting in the queue shortens what is left before the deadline, so the main
    thread of a prefork child arms SIGALRM for the rest. Thread pools cannot use
    signals: there, handlers bound their I/O by ``ctx.remaining``.
    """

    def __init__(self, limit_s: float, request: Any) -> None:
        soft = (getattr(request, "timelimit", None) or (None, None))[1]
        self.arm = (threading.current_thread() is threading.main_thread()
                    and (soft is None or limit_s < soft - 0.05))
        self.limit_s = max(0.001, limit_s)

    def __enter__(self) -> None:
        if self.arm:
            self.previous = signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.limit_s)

    def __exit__(self, *exc: Any) -> None:
        if self.arm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


def _on_alarm(signum: int, frame: Any) -> None:
    raise SoftTimeLimitExceeded("attempt time limit")
