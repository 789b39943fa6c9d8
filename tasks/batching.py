"""Running a batched handler: one delivered task leads, more ready tasks of its type join it.

The delivered task is claimed as any task is (start.lua); then up to
``batch_size - 1`` more ready tasks of the same type are taken from the lane's
broker lists and claimed in one call (claim_batch.lua), waiting at most
``batch_window_ms`` for more. The handler runs once with every item; each item's
outcome then goes the way a single task's would: the succeeded ones finish in
one call (finish_batch.lua) and their result rows are stored in one statement;
a failed item retries or becomes a dead letter on its own, by its own attempt
count and deadline. The delivered task's own outcome is what Celery sees.

A batch is an optimisation, never a change of meaning: see docs/batching.md
for why each per-task guarantee holds.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from celery import Task, states
from celery.app.task import Context as CeleryContext
from celery.exceptions import Ignore, Retry
from django.conf import settings

from lanes import leases
from lanes.lua.claim_batch import claim_batch
from lanes.lua.finish_batch import DoneItem, Latencies, finish_batch
from lanes.lua.loader import ReplicaAcksMissing
from lanes.messages import Envelope
from tasks import config, history, results, tracing
from tasks import signals as lifecycle
from tasks.context import BatchItem, Context
from tasks.errors import AttemptTimeout, DeadLettered, NonRetryableError, RetryableError
from tasks.execution import (
    ROW_STATE,
    Attempt,
    HandlerTask,
    bounded_result,
    execute,
    portable_exception,
    time_limit,
    tombstone_ttl_s,
    until_answered,
)

logger = logging.getLogger(__name__)


class BatchOutcomeMismatch(RetryableError):
    """A batched handler returned a number of outcomes other than its number of items."""


class BatchHandlerTask(HandlerTask):
    """Base of every batched handler's Celery task (``registry.bind``'s ``batch_base``)."""

    batched = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return execute(self, args, kwargs, runner=run)


def run(task: Task, env: Envelope, payload: dict) -> Any:
    """Run the delivered task and the tasks it gathers; return (or raise) the delivered task's outcome."""
    leader = Attempt(task, env, payload)
    now = time.time()
    version = leader.claim(now)
    tc = config.ensure(version).types.get(env.type)
    if tc is None:
        leader.die("malformed", f"unknown task type '{env.type}'")
    items = [leader, *_gather(task, tc, leader)]
    return _Batch(task, tc, items).run()


def _gather(task: Task, tc: config.TypeConf, leader: Attempt) -> list[Attempt]:
    """Claim up to ``batch_size - 1`` more ready tasks, waiting up to the window once for more."""
    want = tc.batch_size - 1
    gathered: list[Attempt] = []
    window_s = tc.batch_window_ms / 1000
    for round_ in range(2):
        if len(gathered) >= want:
            break
        if round_ == 1:
            if window_s <= 0:
                break
            time.sleep(window_s)
        now = time.time()
        try:
            claimed = claim_batch(
                lane=leader.env.lane, handler=task.name, task_type=leader.env.type, owner=leader.owner, now=now,
                lease_ms=int(settings.DISPATCH_LEASE_S * 1000), max_deliveries=settings.DISPATCH_MAX_DELIVERIES,
                most=want - len(gathered), metric_field=leader.field, process=leases.process_id(),
                liveness_ms=leader.book.liveness_ms(),
            )
        except ReplicaAcksMissing as exc:
            # As a single claim (tasks.execution): not run; their leases bring them back.
            logger.warning("batch_claims_unconfirmed lane=%s error=%s: not run", leader.env.lane, exc)
            break
        for message in claimed.messages:
            item = _item_of(task, message, leader)
            if item is not None:
                gathered.append(item)
    return gathered


def _item_of(task: Task, raw: bytes, leader: Attempt) -> Attempt | None:
    """The claimed message as an item (its own id, envelope and request); a malformed one is dead-lettered."""
    try:
        message = json.loads(raw)
        headers = message["headers"]
        _args, kwargs, _embed = json.loads(message["body"])
        env = Envelope.from_dict(kwargs["dispatch"])
        payload = kwargs["payload"]
        if not isinstance(payload, dict):
            raise ValueError("payload is not an object")
    except (ValueError, TypeError, KeyError) as exc:
        logger.error("batch_item_malformed error=%r", exc)
        return None  # its claim's lease runs out; the single path then dead-letters it as malformed
    request = CeleryContext(
        task=task.name, shadow=headers.get("shadow"), argsrepr=headers.get("argsrepr"),
        kwargsrepr=headers.get("kwargsrepr"),
        hostname=getattr(task.request, "hostname", None), periodic_task_name=None, meta={}, children=[],
        dispatch_settle=None,
    )
    item = Attempt(task, env, payload, task_id=headers["id"], request=request, book=leader.book)
    item.owner = leader.owner
    return item


class _Batch:
    def __init__(self, task: Task, tc: config.TypeConf, items: list[Attempt]) -> None:
        self.task = task
        self.tc = tc
        self.items = items
        self.leader = items[0]

    def run(self) -> Any:
        now = time.time()
        leader_outcome: tuple[str, Any] = ("none", None)
        rows: list[tuple[Attempt, Any, str]] = []  # (extra item, result or exception, row state)
        for item in self.items:
            item.book.hold(item.record)
        try:
            outcomes = self._call(now)
            done: list[tuple[Attempt, Any, str]] = []
            for item, outcome in zip(self.items, outcomes, strict=True):
                kind, value = self._settle_one(item, outcome)
                if kind == "done":
                    done.append((item, value[0], value[1]))
                elif item is self.leader:
                    leader_outcome = (kind, value)
                elif kind in ("dead", "retry"):
                    rows.append((item, value, states.FAILURE if kind == "dead" else states.RETRY))
            for item, result, state in self._finish_done(done, now):
                if item is self.leader:
                    leader_outcome = ("done", result)
                else:
                    rows.append((item, result, state))
        finally:
            for item in self.items:
                item.book.release(item.record)
                tracing.end_attempt(item)
        self._store_rows(rows)
        kind, value = leader_outcome
        if kind == "done":
            return value
        if kind == "none":
            raise Ignore()
        raise value

    # -- the handler call ------------------------------------------------------
    def _call(self, now: float) -> list[Any]:
        """One outcome per item: a value, or the exception to handle as that item's failure."""
        tc = self.tc
        outcomes: list[Any] = [None] * len(self.items)
        live: list[int] = []
        for i, item in enumerate(self.items):
            item.started_at = now
            tracing.start_attempt(item, now)
            if now >= item.env.deadline:
                outcomes[i] = _Expired(f"deadline passed {now - item.env.deadline:.3f}s before the attempt "
                                       f"could start")
            else:
                live.append(i)
        if not live:
            return outcomes
        batch = []
        for i in live:
            item = self.items[i]
            env = item.env
            limit = min(tc.attempt_timeout_s, env.deadline - now)
            batch.append(BatchItem(item.payload, Context(
                task_id=item.task_id, type=env.type, lane=env.lane, chat_id=env.chat, attempt=env.attempt,
                deadline=env.deadline, attempt_deadline=now + limit, idempotency_key=env.key or item.task_id,
                metadata=env.meta or {}, options=tc.options)))
            lifecycle.emit(lifecycle.task_started, functools.partial(item.info, now))
            history.started(item.task_id, env, getattr(item.request, "hostname", None) or leases.process_id(), now)
        limit = min(tc.attempt_timeout_s, max(self.items[i].env.deadline - now for i in live))
        try:
            with time_limit(limit, self.task.request), \
                    tracing.handler_span(self.leader, [self.items[i] for i in live]):
                returned = self.task.handler_func(batch)
        except SoftTimeLimitExceeded as exc:
            returned = [AttemptTimeout(f"batch ran past its {limit:.3f}s limit")] * len(live)
            logger.warning("batch_timed_out type=%s items=%d error=%r", tc.name, len(live), exc)
        except BaseException as exc:  # noqa: BLE001 - the whole batch failed: every item fails with it
            returned = [exc] * len(live)
        if not isinstance(returned, Sequence) or isinstance(returned, (str, bytes)) or len(returned) != len(live):
            got = len(returned) if isinstance(returned, Sequence) else type(returned).__name__
            mismatch = BatchOutcomeMismatch(
                f"batched handler '{self.task.name}' returned {got} outcomes for {len(live)} items; "
                f"it must return one outcome per item, in order")
            returned = [mismatch] * len(live)
        for i, outcome in zip(live, returned, strict=True):
            outcomes[i] = outcome
        return outcomes

    # -- each item's outcome ---------------------------------------------------
    def _settle_one(self, item: Attempt, outcome: Any) -> tuple[str, Any]:
        """('done', (result, json)) | ('dead'|'retry'|'skipped', exception raised by the single path's step)."""
        try:
            if isinstance(outcome, _Expired):
                item.die("expired", str(outcome))
            if isinstance(outcome, NonRetryableError):
                item.die("non_retryable", str(outcome), outcome)
            if isinstance(outcome, BaseException):
                item.failed(self.tc, outcome)
            try:
                return "done", (outcome, json.dumps(outcome))
            except (TypeError, ValueError) as exc:
                item.die("non_retryable", f"handler returned a value that is not JSON: {exc}", exc)
        except DeadLettered as failure:
            return "dead", failure
        except Retry as retry:
            return "retry", retry
        except Ignore as ignore:
            return "skipped", ignore
        raise AssertionError("unreachable: die and failed raise")

    def _finish_done(self, done: list[tuple[Attempt, Any, str]], now: float) -> list[tuple[Attempt, Any, str]]:
        """Finish the succeeded items in one call; returns those whose outcome is theirs to store."""
        extras = self.items[1:]
        qlat = _latencies([(it.started_at or now) - it.env.ready_at for it in extras if it.env.attempt == 1])
        if not done and not qlat.buckets:
            return []
        finished_at = time.time()
        elapsed = finished_at - now
        reply = until_answered(lambda: finish_batch(
            items=[DoneItem(it.task_id, it.record, it.env.chat, bounded_result(result_json), it.owner)
                   for it, _, result_json in done],
            now=finished_at, tombstone_ttl_s=tombstone_ttl_s(),
            queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
            settle_lease_ms=int(settings.DISPATCH_LEASE_S * 1000), metric_field=self.leader.field,
            execution=_latencies([elapsed] * len(done)), busy_s=elapsed if done else 0.0, queue=qlat,
        ), "finish_batch", self.leader.task_id)
        stored: list[tuple[Attempt, Any, str]] = []
        for (item, result, _), answer in zip(done, reply, strict=True):
            if answer == "taken":
                logger.warning("finish_skipped task=%s (taken by another worker)", item.task_id)
                continue
            item.request.dispatch_settle = (item.record, ROW_STATE["done"])
            stored.append((item, result, states.SUCCESS))
            item.emit_finished(finished_at)  # its lifecycle signal, history and span
        return stored

    def _store_rows(self, rows: list[tuple[Attempt, Any, str]]) -> None:
        """The extra items' result rows in one statement; then their finished records may be settled."""
        results.store_rows(self.task.backend, [
            results.Outcome(item.task_id, item.env.type, item.request,
                            (portable_exception(value.exc) if value.exc is not None else RetryableError(str(value)))
                            if isinstance(value, Retry) else value, state)
            for item, value, state in rows], self.leader.book)


class _Expired(Exception):
    """An item whose deadline passed before the batch could start it."""


def _latencies(seconds: list[float]) -> Latencies:
    return Latencies.of(seconds)

