"""Plain tasks in groups: a thread-pool worker runs platform messages without Celery's per-message request.

Most of a plain task's cost was fixed work paid once per message: Celery's
request machinery in the worker's main process (a ``Request``, its strategy,
the pool's bookkeeping), then a round trip to claim, one to finish, and a
statement for the result row. Here, on a thread-pool worker, a platform
message reaches :func:`strategy` (Celery's ``Task.Strategy`` extension point,
named on ``HandlerTask``) and goes to the process's :class:`Runner`, which

- claims every message delivered since its last claim in one call
  (``claim_group.lua``: each item exactly as ``start.lua`` claims one);
- runs each handler on a thread of its own, so a slow task never holds back
  the others claimed with it (a 20 ms and a 2 s handler finish at 20 ms and 2 s);
- records the succeeded attempts finished since its last flush in one call
  (``finish_batch.lua``) and their result rows in one statement, then acks
  each message and sends its Celery events (folded: ``tasks.worker_events``)
  and signals;
- takes a failing attempt through the single path's steps
  (``Attempt.outcome_of``: retry, dead letter, cancel), one by one.

Grouping is an optimisation, never a change of meaning: each task keeps its
own claim and lease, attempt count, deadline, chat order (only a chat's head
is ever published, so two of one chat are never in flight), limits, result row
and metrics. A message the runner cannot read, a batched handler, and every
worker that is not a thread pool take Celery's own path (``execute``).

An attempt past its limit is over on this pool too (a thread cannot be
killed): the watchdog retries or dead-letters it by its policy at the limit
(``retry.lua`` is fenced by the claim's owner), its late end changes nothing,
and its thread is counted as stuck and replaced by a new one, up to
``DISPATCH_STUCK_THREADS_MAX``; past that the worker takes no more work and
restarts itself (Celery's SIGHUP restart: a warm shutdown, then the same command line again).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import signals as celery_signals
from celery import states
from celery.app.task import Context as CeleryContext
from celery.exceptions import Ignore, Retry
from celery.worker.strategy import default as default_strategy
from django.conf import settings

from lanes import leases
from lanes.histogram import bucket_label
from lanes.lua.claim_group import GroupItem, claim_group
from lanes.lua.finish_batch import DoneItem, Latencies, finish_batch
from lanes.lua.loader import ReplicaAcksMissing
from lanes.messages import Envelope
from lanes.transport import LEASED_HEADER, RECORD_HEADER
from tasks import config, results, tracing
from tasks.errors import AttemptTimeout, DeadLettered, RetryableError
from tasks.execution import (
    Attempt,
    Finished,
    bounded_result,
    portable_exception,
    tombstone_ttl_s,
    until_answered,
)

logger = logging.getLogger(__name__)

#: Most items one claim or one finish call carries.
GROUP_MAX = 200
#: Seconds between two looks of the watchdog at the running attempts.
WATCH_EVERY_S = 0.1


def enabled(consumer: Any) -> bool:
    """Whether this worker runs plain platform messages in groups: a thread pool, and ``DISPATCH_GROUPING`` on."""
    pool = getattr(consumer, "pool", None)
    return bool(settings.DISPATCH_GROUPING) and type(pool).__module__ == "celery.concurrency.thread"


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
    """``HandlerTask.Strategy``: platform messages of a plain handler go to the runner, the rest to Celery's."""
    fallback = default_strategy(task, app, consumer, **kwargs)
    if getattr(task, "batched", False) or not enabled(consumer):
        return fallback
    runner = Runner.of(consumer)

    def on_message(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kw: Any) -> Any:
        item = runner.item_of(task, message, ack, reject) if not runner.stopping else None
        if item is None:
            return fallback(message, body, ack, reject, callbacks, **kw)
        runner.submit(item)
        return None

    return on_message


class Item:
    """One delivered message on its way through the runner."""

    __slots__ = (
        "abandoned",
        "ack",
        "attempt",
        "claimed",
        "done",
        "held",
        "message",
        "name",
        "reject",
        "tc",
        "version",
        "watch_until",
    )

    def __init__(self, attempt: Attempt, message: Any, ack: Any, reject: Any, name: str) -> None:
        self.attempt = attempt
        self.message = message
        self.ack = ack
        self.reject = reject
        self.name = name  # the task type (the message's shadow name): what Flower shows
        self.claimed = False
        self.version = ""
        self.tc: config.TypeConf | None = None
        self.watch_until = 0.0
        self.abandoned = False
        self.done = False
        self.held = False  # its record's lease is renewed by this process (lanes.leases.LeaseBook.hold)

    def hold(self) -> None:
        self.held = True
        self.attempt.book.hold(self.attempt.record)

    def release(self) -> None:
        if self.held:
            self.held = False
            self.attempt.book.release(self.attempt.record)


_STOP = object()


class Runner:
    """A worker process's group runner (see the module docstring): claimer, threads, finisher, watchdog."""

    _by_consumer: dict[int, Runner] = {}
    _lock = threading.Lock()

    @classmethod
    def of(cls, consumer: Any) -> Runner:
        with cls._lock:
            runner = cls._by_consumer.get(id(consumer))
            if runner is None:
                runner = cls._by_consumer[id(consumer)] = cls(consumer)
            return runner

    @classmethod
    def existing(cls, consumer: Any) -> Runner | None:
        with cls._lock:
            return cls._by_consumer.get(id(consumer))

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.hostname = consumer.hostname
        self.size = max(1, int(getattr(consumer.pool, "limit", None) or 1))
        self.stuck_max = settings.DISPATCH_STUCK_THREADS_MAX or self.size
        self.connection_errors = consumer.connection_errors
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._runs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._mutex = threading.Lock()
        self._running: dict[int, Item] = {}
        self._in_flight = 0
        self._idle = threading.Condition(self._mutex)
        self._threads = 0
        self._seq = 0
        self.stuck = 0
        self.stopping = False
        controller = getattr(consumer, "controller", None)
        if controller is not None:  # read by the worker's heartbeat (lanes.worker.HeartbeatStep)
            controller.dispatch_stuck_threads = lambda: self.stuck
        self._start("dispatch-claim", self._claim_forever)
        self._start("dispatch-finish", self._finish_forever)
        self._start("dispatch-watch", self._watch_forever)
        for _ in range(self.size):
            self._add_thread()

    @property
    def events(self) -> Any:
        """The consumer's event dispatcher when it sends events (a reconnect makes a new one)."""
        eventer = getattr(self.consumer, "event_dispatcher", None)
        return eventer if eventer is not None and eventer.enabled else None

    # -- taking messages -------------------------------------------------------
    def item_of(self, task: Any, message: Any, ack: Any, reject: Any) -> Item | None:
        """The message as an item, or None for Celery's own path (not a leased platform message, or malformed)."""
        try:
            return self._item_of(task, message, ack, reject)
        except Exception:
            logger.exception("group_item_unread task=%s", getattr(message, "headers", {}).get("id"))
            return None

    def _item_of(self, task: Any, message: Any, ack: Any, reject: Any) -> Item | None:
        headers = message.headers
        if headers.get(LEASED_HEADER) is not True or not isinstance(headers.get(RECORD_HEADER), str):
            return None
        try:
            args, kwargs, _embed = json.loads(message.body)
            if args or set(kwargs) != {"payload", "dispatch"} or not isinstance(kwargs["payload"], dict):
                return None
            env = Envelope.from_dict(kwargs["dispatch"])
            task_id = headers["id"]
        except (TypeError, ValueError, KeyError):
            return None
        request = CeleryContext(
            id=task_id, task=task.name, argsrepr=headers.get("argsrepr"), kwargsrepr=headers.get("kwargsrepr"),
            shadow=headers.get("shadow"), hostname=self.hostname, periodic_task_name=None, meta={}, children=[],
            dispatch_settle=None,
            timelimit=None, retries=env.attempt - 1, delivery_info=message.delivery_info, is_eager=False,
        )
        attempt = Attempt(task, env, kwargs["payload"], task_id=task_id, request=request)
        return Item(attempt, message, ack, reject, headers.get("shadow") or task.name)

    def submit(self, item: Item) -> None:
        with self._mutex:
            self._in_flight += 1
        try:
            self._received(item)
        except Exception:
            logger.warning("received_event_not_sent task=%s", item.attempt.task_id, exc_info=True)
        self._inbox.put(item)

    def _received(self, item: Item) -> None:
        events = self.events
        if events is not None:
            request = item.attempt.request
            events.send("task-received", uuid=request.id, name=item.name, args=request.argsrepr,
                             kwargs=request.kwargsrepr, root_id=request.id, parent_id=None,
                             retries=request.retries, eta=None, expires=None)

    # -- claiming --------------------------------------------------------------
    def _claim_forever(self) -> None:
        while True:
            group = _drain(self._inbox, GROUP_MAX)
            try:
                self._claim(group)
            except Exception:
                logger.exception("group_claim_failed items=%d", len(group))
                for item in group:
                    self._runs.put(item)

    def _claim(self, group: list[Item]) -> None:
        if self.stopping:
            for item in group:
                self._hand_back(item)
            return
        now = time.time()
        process = leases.process_id()
        members = []
        counts = []
        for item in group:
            attempt = item.attempt
            with self._mutex:
                self._seq += 1
                attempt.owner = f"{process}:g{self._seq}"
            env = attempt.env
            qlat = now - env.ready_at
            members.append(GroupItem(attempt.task_id, attempt.record, env.attempt, attempt.owner, env.chat))
            counts.append((attempt.field, bucket_label(qlat) if env.attempt == 1 else "", qlat))
        try:
            answer = until_answered(lambda: claim_group(
                items=members, now=now, lease_ms=int(settings.DISPATCH_LEASE_S * 1000),
                max_deliveries=settings.DISPATCH_MAX_DELIVERIES, process=process,
                liveness_ms=group[0].attempt.book.liveness_ms(), counts=counts,
            ), "claim_group", group[0].attempt.task_id)
        except ReplicaAcksMissing as exc:
            # As a single claim: not run; their leases bring them back once replicas keep up.
            logger.warning("group_claims_unconfirmed items=%d error=%s: not run", len(group), exc)
            for item in group:
                self._end(item)
            return
        group[0].attempt.book.keep_alive()
        for item, claim in zip(group, answer.claims, strict=True):
            if claim.status == "run":
                item.claimed = True
                item.version = answer.config_version
                item.hold()
            else:
                item.attempt.owner = ""  # the single path claims (or answers) it again, with its own owner
            self._runs.put(item)

    # -- running ---------------------------------------------------------------
    def _add_thread(self) -> None:
        with self._mutex:
            self._threads += 1
        self._start("dispatch-run", self._run_forever)

    def _run_forever(self) -> None:
        while True:
            item = self._runs.get()
            if item is _STOP:
                return
            try:
                if item.claimed:
                    self._run_claimed(item)
                else:
                    self._run_single(item)
            except Exception:
                logger.exception("group_item_failed task=%s", item.attempt.task_id)
                item.release()
                self._end(item)
            with self._mutex:
                # A thread that came back from an abandoned attempt leaves when its replacement runs.
                if self._threads > self.size + self.stuck:
                    self._threads -= 1
                    return

    def _run_single(self, item: Item) -> None:
        """Anything but a plain 'run' claim (finished, busy, poison, stale, ...): the single path decides."""
        attempt = item.attempt
        task = attempt.task
        task.push_request(**vars(attempt.request))
        try:
            try:
                value = attempt.run()
            except Finished as finished:
                value = finished.result
        except (Retry, DeadLettered, Ignore) as exc:
            self._complete(item, exc)
            return
        except Exception as exc:  # noqa: BLE001 - as Celery would store it
            self._complete(item, exc)
            return
        finally:
            task.pop_request()
        self._rows([(item, value, states.SUCCESS)])
        self._end(item, value=value)

    def _run_claimed(self, item: Item) -> None:
        attempt = item.attempt
        task = attempt.task
        try:
            tc, ctx, limit = attempt.begin(item.version)
        except (Retry, DeadLettered, Ignore) as exc:
            item.release()
            self._complete(item, exc)
            return
        item.tc = tc
        if self.events is not None:
            self.events.send("task-started", uuid=attempt.task_id)
        with self._mutex:
            item.watch_until = time.monotonic() + limit
            self._running[id(item)] = item
        task.push_request(**vars(attempt.request))
        celery_signals.task_prerun.send(sender=task, task_id=attempt.task_id, task=task, args=(),
                                        kwargs={"payload": attempt.payload})
        try:
            try:
                with tracing.handler_span(attempt):
                    returned: Any = task.handler_func(attempt.payload, ctx)
            except BaseException as exc:  # noqa: BLE001 - contain SystemExit/KeyboardInterrupt from handlers too
                returned = exc
        finally:
            task.pop_request()
        with self._mutex:
            abandoned = item.abandoned
            if not abandoned:
                self._running.pop(id(item), None)
        if abandoned:
            # Ran past its limit: the watchdog ended the attempt; this late end changes nothing.
            with self._mutex:
                self.stuck -= 1
            logger.warning("late_end_ignored task=%s type=%s: its attempt was over at its limit",
                           attempt.task_id, attempt.env.type)
            return
        try:
            result, result_json = attempt.outcome_of(tc, returned)
        except (Retry, DeadLettered, Ignore) as exc:
            item.release()
            self._complete(item, exc)
            return
        self._done.put((item, result, result_json))

    # -- the watchdog ----------------------------------------------------------
    def _watch_forever(self) -> None:
        while True:
            time.sleep(WATCH_EVERY_S)
            now = time.monotonic()
            with self._mutex:
                overdue = [item for item in self._running.values() if now >= item.watch_until]
                for item in overdue:
                    del self._running[id(item)]
                    item.abandoned = True
                    self.stuck += 1
                stuck = self.stuck
            for item in overdue:
                self._abandon(item, stuck)

    def _abandon(self, item: Item, stuck: int) -> None:
        attempt = item.attempt
        logger.warning("attempt_over_limit task=%s type=%s stuck_threads=%d: retried by its policy; its thread "
                       "is stuck until the handler returns", attempt.task_id, attempt.env.type, stuck)
        if stuck <= self.stuck_max:
            self._add_thread()
        elif not self.stopping:
            self.stopping = True
            self._replace_worker(stuck)
        assert item.tc is not None
        limit = min(item.tc.attempt_timeout_s, attempt.env.deadline - attempt.started_at)
        try:
            attempt.outcome_of(item.tc, AttemptTimeout(f"attempt ran past its {limit:.3f}s limit"))
        except (Retry, DeadLettered, Ignore) as exc:
            item.release()
            self._complete(item, exc)
        except Exception:
            logger.exception("abandon_failed task=%s", attempt.task_id)
            item.release()
            self._end(item)

    def _replace_worker(self, stuck: int) -> None:
        """Too many threads stuck: take no more work, end what runs, and start afresh.

        Celery's own restart (SIGHUP, installed when the worker has no terminal: under ``make run``'s
        supervisor and any service manager) is a warm shutdown and then an ``exec`` of the same command
        line, which ends the stuck threads with the process image; the pid stays, so a supervisor sees
        no exit. Without that handler, a warm shutdown (SIGTERM), for the supervisor to start a new one.
        """
        hup = getattr(signal, "SIGHUP", None)
        restart = hup is not None and signal.getsignal(hup) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        logger.error("worker_stuck threads=%d max=%d: taking no more work; %s", stuck, self.stuck_max,
                     "restarting in place (SIGHUP)" if restart else "shutting down warm for a fresh worker")
        os.kill(os.getpid(), hup if restart and hup is not None else signal.SIGTERM)

    # -- outcomes --------------------------------------------------------------
    def _complete(self, item: Item, exc: BaseException) -> None:
        """An attempt that did not succeed: its row (FAILURE, RETRY; none for Ignore), then the message's ack."""
        attempt = item.attempt
        task = attempt.task
        if isinstance(exc, Ignore):
            self._end(item)
            return
        if isinstance(exc, Retry):
            value: BaseException = portable_exception(exc.exc) if exc.exc is not None else RetryableError(str(exc))
            state = states.RETRY
        else:
            value, state = exc, states.FAILURE
        self._rows([(item, value, state)])
        if self.events is not None:
            kind = "task-retried" if state == states.RETRY else "task-failed"
            self.events.send(kind, uuid=attempt.task_id, exception=repr(value), traceback=None)
        if state == states.RETRY:
            celery_signals.task_retry.send(sender=task, request=attempt.request, reason=exc, einfo=None)
        else:
            celery_signals.task_failure.send(sender=task, task_id=attempt.task_id, exception=exc, args=(),
                                             kwargs={"payload": attempt.payload}, traceback=None, einfo=None)
        self._end(item, state=state)

    def _finish_forever(self) -> None:
        while True:
            done = _drain(self._done, GROUP_MAX)
            try:
                self._finish(done)
            except Exception:
                logger.exception("group_finish_failed items=%d", len(done))
                for item, _, _ in done:
                    item.release()
                    self._end(item)

    def _finish(self, done: list[tuple[Item, Any, str]]) -> None:
        finished_at = time.time()
        by_field: dict[str, list[tuple[Item, Any, str]]] = {}
        for entry in done:
            by_field.setdefault(entry[0].attempt.field, []).append(entry)
        rows = []
        for field, entries in by_field.items():
            elapsed = [finished_at - item.attempt.started_at for item, _, _ in entries]
            replies = until_answered(functools.partial(
                finish_batch,
                items=[DoneItem(item.attempt.task_id, item.attempt.record, item.attempt.env.chat,
                                bounded_result(result_json), item.attempt.owner)
                       for item, _, result_json in entries],
                now=finished_at, tombstone_ttl_s=tombstone_ttl_s(),
                queued_lease_ms=int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
                settle_lease_ms=int(settings.DISPATCH_LEASE_S * 1000), metric_field=field,
                execution=Latencies.of(elapsed), busy_s=sum(elapsed), queue=Latencies({}, 0.0),
            ), "finish_batch", entries[0][0].attempt.task_id)
            for (item, result, _), reply in zip(entries, replies, strict=True):
                item.release()
                if reply == "taken":
                    logger.warning("finish_skipped task=%s (taken by another worker)", item.attempt.task_id)
                    self._end(item)
                    continue
                item.attempt.request.dispatch_settle = (item.attempt.record, states.SUCCESS)
                item.attempt.emit_finished(finished_at)
                rows.append((item, result, states.SUCCESS))
        self._rows(rows)
        for item, result, _ in rows:
            self._end(item, value=result, state=states.SUCCESS)

    def _rows(self, rows: list[tuple[Item, Any, str]]) -> None:
        """Result rows in one statement; then their finished records may be settled."""
        if not rows:
            return
        kept = []
        for item, value, state in rows:
            if results.keeps_row(item.name, state):
                kept.append((item, value, state))
            elif (settle := item.attempt.request.dispatch_settle) and settle[1] == state:
                item.attempt.book.settle(settle[0])  # its type keeps no row for this outcome: settled at once
        rows = kept
        if not rows:
            return
        backend = rows[0][0].attempt.task.backend
        try:
            encoded = []
            for item, value, state in rows:
                request = item.attempt.request
                row, _ = backend.result_row(request.id, backend.encode_result(value, state), state, None, request)
                encoded.append(row)
            results.upsert_rows(None, encoded, keep_ready=all(state not in states.READY_STATES
                                                              for _, _, state in rows))
        except Exception:
            logger.exception("group_rows_not_stored items=%d", len(rows))
            for item, _, _ in rows:
                item.attempt.request.dispatch_settle = None
            return
        for item, _, state in rows:
            settle = item.attempt.request.dispatch_settle
            if settle and settle[1] == state:
                item.attempt.book.settle(settle[0])

    def _end(self, item: Item, value: Any = None, state: str | None = None) -> None:
        """The message is done with: acked (its record tracks the task from here), events and signals sent."""
        if item.done:
            return
        item.done = True
        attempt = item.attempt
        tracing.end_attempt(attempt)
        if state == states.SUCCESS:
            if self.events is not None:
                runtime = time.time() - attempt.started_at if attempt.started_at else 0.0
                self.events.send("task-succeeded", uuid=attempt.task_id, result=_short_repr(value), runtime=runtime)
            celery_signals.task_success.send(sender=attempt.task, result=value)
        if item.claimed or state is not None:
            celery_signals.task_postrun.send(sender=attempt.task, task_id=attempt.task_id, task=attempt.task,
                                             args=(), kwargs={"payload": attempt.payload}, retval=value,
                                             state=state)
        try:
            if self.stopping:  # the event loop waits for drain(): ack here (a leased message's ack is in memory)
                item.message.ack_log_error(logger, self.connection_errors)
            else:
                item.ack(logger, self.connection_errors)
        except Exception:
            logger.warning("ack_failed task=%s", attempt.task_id, exc_info=True)
        with self._mutex:
            self._in_flight -= 1
            if self._in_flight <= 0:
                self._idle.notify_all()

    def _hand_back(self, item: Item) -> None:
        """Not claimed, and the worker is stopping: the message goes back to its lane for another worker."""
        item.done = True
        try:
            item.reject(logger, self.connection_errors, requeue=True)
        except Exception:
            logger.warning("hand_back_failed task=%s", item.attempt.task_id, exc_info=True)
        with self._mutex:
            self._in_flight -= 1
            if self._in_flight <= 0:
                self._idle.notify_all()

    # -- shutting down ---------------------------------------------------------
    def drain(self, timeout_s: float) -> bool:
        """Take no more work; wait up to ``timeout_s`` for what was taken to end. True if all did."""
        self.stopping = True
        until = time.monotonic() + timeout_s
        with self._mutex:
            while self._in_flight - self.stuck > 0:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.2))
        return True

    @staticmethod
    def _start(name: str, target: Callable[[], None]) -> None:
        threading.Thread(target=target, name=name, daemon=True).start()


def _drain(q: queue.SimpleQueue[Any], most: int) -> list[Any]:
    """The next entry (waiting for it), and every other already waiting, up to ``most``."""
    out = [q.get()]
    while len(out) < most:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            break
    return out


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 1024 else text[:1021] + "..."

