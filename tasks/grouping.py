"""Plain tasks in groups: a thread-pool worker runs platform messages without Celery's per-message request.

Most of a plain task's cost was fixed work paid once per message: Celery's
request machinery in the worker's main process (a ``Request``, its strategy,
the pool's bookkeeping), then a round trip to claim, one to finish, and a
statement for the result row. Here, on a thread-pool worker, a platform
message reaches :func:`strategy` (Celery's ``Task.Strategy`` extension point,
named on ``HandlerTask``) and goes to the process's :class:`Runner`, whose
run threads share the work (no claimer or finisher thread: each hop between
threads was a wake-up under a busy scheduler, four per task):

- the claim at the pop: while run threads wait for work, the transport's pop
  (``pop_more.lua``) claims as many of this runner's messages as they can take
  at once, each exactly as ``start.lua`` claims one, and holds their leases
  (``LeaseBook.claimed_at_pop``); such a message goes straight to a waiting
  thread (``_pop_claims``, ``item_of``): no claim call, no hop;
- a thread that finds work and no Redis call in progress makes one call
  (``claim_group.lua``) that first finishes the successes gathered since the
  last call (each exactly as ``finish.lua`` finishes one) and then claims
  every message delivered unclaimed since (each exactly as ``start.lua``
  claims one); it runs the first claimed item itself and leaves the rest to
  the threads waiting;
- each handler runs on a thread of its own, so a slow task never holds back
  the others claimed with it (a 20 ms and a 2 s handler finish at 20 ms and 2 s);
- a success waits for the next call: the same thread makes it on its next
  turn unless another is already in one, which then takes it along (group
  commit: one finish in an idle worker, many under load, folded into the
  next claim when messages are waiting). The successes' result rows go in one
  statement (``results.store_rows``), then each message is acked and its
  Celery events (folded: ``tasks.worker_events``) and signals are sent;
- a failing attempt takes the single path's steps (``Attempt.outcome_of``:
  retry, dead letter, cancel), one by one.

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
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from celery import signals as celery_signals
from celery import states
from celery.app.task import Context as CeleryContext
from celery.exceptions import Ignore, Retry
from celery.worker.request import Request as CeleryRequest
from celery.worker.strategy import default as default_strategy
from django.conf import settings

from lanes import leases
from lanes.histogram import bucket_label
from lanes.lua.claim_group import FinishTerms, GroupItem, claim_group
from lanes.lua.finish_batch import DoneItem, Latencies, count_batch, finish_batch
from lanes.lua.loader import ReplicaAcksMissing
from lanes.lua.pop_more import PopClaims
from lanes.messages import Envelope, written_of
from lanes.transport import LEASED_HEADER, RECORD_HEADER
from tasks import config, results, tracing
from tasks.errors import AttemptTimeout, DeadLettered, RetryableError
from tasks.execution import (
    Attempt,
    Finished,
    bounded_result,
    claim_terms,
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
    runner.handlers.add(task.name)  # its messages may be claimed at the pop

    def on_message(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kw: Any) -> Any:
        item = runner.item_of(task, message, ack, reject)
        # Stopping, a message not claimed yet takes Celery's path; one the pop claimed runs here.
        if item is None or (runner.stopping and not item.claimed):
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
        # Celery's ack and reject promises for a message its dispatch gave the strategy; None for one the pop
        # handed over (``_take``): then the consumer's ``call_soon_ack`` of the message's own.
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


class Runner:
    """A worker process's group runner (see the module docstring): run threads that claim and finish, a watchdog."""

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
        #: The configuration the rows are written by, read once (None: at the first group's rows, its
        #: task's backend being the app's).
        self._row_terms: results.RowTerms | None = None
        self.connection_errors = consumer.connection_errors
        self._mutex = threading.Lock()
        # The run threads' shared work, under the mutex: messages not yet claimed, claimed ones waiting
        # for a thread, and successes waiting for their finish. One thread at a time makes the Redis
        # call that claims and finishes what has gathered (``_calling``); the others run handlers.
        self._work = threading.Condition(self._mutex)
        self._fresh: deque[Item] = deque()
        self._ready: deque[Item] = deque()
        self._pending: list[tuple[Item, Any, str]] = []
        self._calling = False
        self._running: dict[int, Item] = {}
        self._in_flight = 0
        self._idle = threading.Condition(self._mutex)
        self._threads = 0
        self._idle_threads = 0  # run threads waiting for work
        self._waking = 0  # of those, the ones woken that have not returned from their wait yet (``_wake_next``)
        # Run threads in code that may take long (a handler, its signals and hooks, a group's finish): the others
        # (not waiting either) come back for work without running any, at most after a claim call.
        self._busy = 0
        self._seq = 0
        self._pop_seq = 0
        #: The handlers whose messages this runner takes (their strategies are this module's).
        self.handlers: set[str] = set()
        self.stuck = 0
        self.stopping = False
        controller = getattr(consumer, "controller", None)
        if controller is not None:  # read by the worker's heartbeat (lanes.worker.HeartbeatStep)
            controller.dispatch_stuck_threads = lambda: self.stuck
        self._start("dispatch-watch", self._watch_forever)
        for _ in range(self.size):
            self._add_thread()
        # Claims must reach the replicas before a run (DISPATCH_REPLICA_ACKS): there the run threads claim.
        if settings.DISPATCH_CLAIM_AT_POP and settings.DISPATCH_REPLICA_ACKS <= 0:
            leases.current().pop_claims = self._pop_claims
        # This runner's messages come straight from the transport's pop (``_taker_of``).
        leases.current().taker_of = self._taker_of

    @property
    def events(self) -> Any:
        """The consumer's event dispatcher when it sends events (a reconnect makes a new one)."""
        eventer = getattr(self.consumer, "event_dispatcher", None)
        return eventer if eventer is not None and eventer.enabled else None

    # -- taking messages -------------------------------------------------------
    def _pop_claims(self) -> PopClaims | None:
        """What the transport's next pop may claim (``pop_more.lua``): as many messages as run threads wait
        for work, so that a message claimed at the pop runs at once (a message the threads cannot take yet
        stays unclaimed: a cancel meanwhile still drops it, and it counts as waiting). The event loop's
        thread calls it; the counts are read without the lock (a bound, never a promise: a claimed message
        that waits for a thread keeps its lease, renewed by the book, and its deadline is checked when it
        begins)."""
        if self.stopping:
            return None
        room = self._idle_threads - len(self._ready) - len(self._fresh)
        if room <= 0 or not self.handlers:
            return None
        self._pop_seq += 1
        return PopClaims(room, self.handlers, f"{leases.process_id()}:p{self._pop_seq}.")

    def _taker_of(self, raw: dict) -> Callable[[Any], None] | None:
        """The lane consumer fed by the pop (``lanes.transport``): a popped message of a handler of this runner
        comes to ``_take`` instead of kombu's consumer callback and Celery's dispatch by task name (two promises
        and a strategy lookup a message, then ``strategy``'s work); None: that path, as before (not this
        runner's handler, stopping, no task consumer, or Celery still restoring its prefetch after a
        reconnect, which its own dispatch does on the acks). The event loop's thread calls it."""
        consumer = self.consumer
        if self.stopping or getattr(consumer, "task_consumer", None) is None or not _prefetch_settled(consumer):
            return None
        headers = raw.get("headers")
        if not isinstance(headers, dict) or headers.get("task") not in self.handlers:
            return None
        return self._take

    def _take(self, message: Any) -> None:
        """A popped message, in the channel's QoS: run here, or (unreadable, or stopping and unclaimed) passed
        to kombu's consumer as it would have been, and so to Celery's own path."""
        consumer = self.consumer
        task = consumer.app.tasks[message.headers["task"]]
        # No ack or reject of its own: the consumer's, sent from the event loop's thread as Celery's dispatch
        # sends a strategy's (``_ack``: a group's successes in one callback).
        item = self.item_of(task, message, None, None)
        if item is None or (self.stopping and not item.claimed):
            consumer.task_consumer._receive_callback(message)
            return
        self.submit(item)

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
            written = written_of(message)
            if written is not None and written.envelope is not None:  # the transport's parts: parsed once
                payload, envelope = _loads(written.payload_json), written.envelope
            else:  # delivered by kombu (or an older record's whole message): the body
                args, kwargs, _embed = _loads(message.body)
                if args or set(kwargs) != {"payload", "dispatch"}:
                    return None
                payload, envelope = kwargs["payload"], kwargs["dispatch"]
            if not isinstance(payload, dict):
                return None
            env = Envelope.from_dict(envelope)
            task_id = headers["id"]
        except (TypeError, ValueError, KeyError):
            return None
        request = request_context(
            id=task_id, task=task.name, argsrepr=headers.get("argsrepr"), kwargsrepr=headers.get("kwargsrepr"),
            shadow=headers.get("shadow"), hostname=self.hostname, children=[], timelimit=None,
            retries=env.attempt - 1, delivery_info=message.delivery_info, is_eager=False,
        )
        attempt = Attempt(task, env, payload, task_id=task_id, request=request)
        item = Item(attempt, message, ack, reject, headers.get("shadow") or task.name)
        popped = attempt.book.take_claimed_at_pop(attempt.record)
        if popped is not None:  # claimed at the pop, its lease held (lanes.transport): it runs as claimed
            item.claimed, item.held = True, True
            item.version = attempt.claimed_at_pop(popped.owner, popped.config_version, time.time())
        return item

    def submit(self, item: Item) -> None:
        try:
            self._received(item)
        except Exception:
            logger.warning("received_event_not_sent task=%s", item.attempt.task_id, exc_info=True)
        with self._work:
            self._in_flight += 1
            (self._ready if item.claimed else self._fresh).append(item)
            self._wake_next()  # unless a thread woken earlier, or not busy, will take it

    def _wake_next(self) -> None:
        """Under the mutex: wake one waiting run thread when work is left that no thread is about to take.

        One wake-up at a time, and only when every other run thread is waiting or busy (``_busy``: in a
        handler, its signals, a group's finish): a thread woken earlier, or one between two pieces of work
        or in a claim call, takes the work without a wake-up. A thread that takes work becomes busy and,
        before it runs it, wakes the next if work is still left, so a handler (slow or not) never holds back
        the work behind it; what may wait is a claim call in progress, as unclaimed work always did. The
        event loop so wakes one thread a burst of messages, not one a message, and a burst wakes the
        threads it needs rather than one a message, most of which found their work taken (a wake-up is a
        futex call, then a thread waiting for the GIL).
        """
        if (not self._waking and self._idle_threads > 0 and self._threads - self._busy - self._idle_threads <= 0
                and (self._ready or (not self._calling and (self._fresh or self._pending)))):
            self._waking += 1
            self._work.notify()

    def _received(self, item: Item) -> None:
        if celery_signals.task_received.receivers:  # what Celery's strategy sends, only when someone listens
            self._signal_received(item)
        events = self.events
        if events is not None:
            request = item.attempt.request
            events.send("task-received", uuid=request.id, name=item.name, args=request.argsrepr,
                             kwargs=request.kwargsrepr, root_id=request.id, parent_id=None,
                             retries=request.retries, eta=None, expires=None)

    def _signal_received(self, item: Item) -> None:
        """Celery's ``task_received``, sent as its strategy sends it: by the consumer, with a ``Request`` of
        the message (built only for a listener: the grouped path runs without one)."""
        consumer = self.consumer
        request = CeleryRequest(item.message, on_ack=self._acker(item), on_reject=self._rejecter(item),
                                hostname=self.hostname,
                                app=consumer.app, task=item.attempt.task,
                                connection_errors=consumer.connection_errors)
        celery_signals.task_received.send(sender=consumer, request=request)

    # -- claiming and finishing: whichever run thread finds no call in progress -------------------
    def _step(self, fresh: list[Item], done: list[tuple[Item, Any, str]]) -> None:
        """Finish what succeeded and claim what was delivered since the last call, in one call to Redis; this
        thread runs the first claimed item itself (no hand-off in steady flow), the others go to the threads
        waiting."""
        mine: Item | None = None
        busy = False
        try:
            now = time.time()
            if fresh and self.stopping:
                for item in fresh:
                    self._hand_back(item)
                fresh = []
            # The claims wait for the replicas' acks (DISPATCH_REPLICA_ACKS): there a finish goes in a call of
            # its own, as ReplicaAcksMissing would lose its replies.
            folded = done if settings.DISPATCH_REPLICA_ACKS <= 0 else []
            finished: list[str] | None = None
            if fresh:
                claimed, finished = self._claim(fresh, folded, now)
                if claimed:
                    mine = claimed[0]
            with self._work:  # busy from here: the group's finish (signals, hooks), then the first item
                busy = True
                self._busy += 1
                if mine is not None:
                    self._ready.extend(claimed[1:])
                self._wake_next()
            if done:
                self._finish(done, finished, now)
        finally:
            with self._work:
                if not busy:
                    self._busy += 1  # as ``_run_forever`` counts it back
                self._calling = False
                self._wake_next()
        if mine is not None:
            self._run(mine)

    def _claim(self, group: list[Item], done: list[tuple[Item, Any, str]],
               now: float) -> tuple[list[Item], list[str] | None]:
        """Claimed in one call, with ``done`` finished first in it. Returns the items to run (each claimed, or
        unclaimed for the single path) and the finish's replies (None: not finished, the call failed)."""
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
                items=members, now=now, counts=counts, done=_done_items(done), finish=_finish_terms(),
                **claim_terms(group[0].attempt.book),
            ), "claim_group", group[0].attempt.task_id)
        except ReplicaAcksMissing as exc:
            # As a single claim: not run; their leases bring them back once replicas keep up.
            logger.warning("group_claims_unconfirmed items=%d error=%s: not run", len(group), exc)
            for item in group:
                self._end(item)
            return [], None
        except Exception:
            logger.exception("group_claim_failed items=%d", len(group))
            for item in group:
                item.attempt.owner = ""
            return group, None  # unclaimed: the single path claims (or answers) each
        group[0].attempt.book.keep_alive()
        for item, claim in zip(group, answer.claims, strict=True):
            if claim.status == "run":
                item.claimed = True
                item.version = answer.config_version
                item.hold()
            else:
                item.attempt.owner = ""  # the single path claims (or answers) it again, with its own owner
        return group, answer.finished if done else None

    # -- running ---------------------------------------------------------------
    def _add_thread(self) -> None:
        with self._mutex:
            self._threads += 1
        self._start("dispatch-run", self._run_forever)

    def _run_forever(self) -> None:
        busy = False
        while True:
            fresh: list[Item] = []
            done: list[tuple[Item, Any, str]] = []
            with self._work:
                if busy:  # back from a run or a step
                    self._busy -= 1
                    busy = False
                while True:
                    # A thread that came back from an abandoned attempt leaves when its replacement runs.
                    if self._threads > self.size + self.stuck:
                        self._threads -= 1
                        self._wake_next()
                        return
                    if self._ready:
                        item: Item | None = self._ready.popleft()
                        self._busy += 1
                        self._wake_next()  # before this thread runs its own: the rest must not wait for it
                        break
                    if not self._calling and (self._fresh or self._pending):
                        self._calling = True
                        item = None
                        while self._fresh and len(fresh) < GROUP_MAX:
                            fresh.append(self._fresh.popleft())
                        done, self._pending[:GROUP_MAX] = self._pending[:GROUP_MAX], []
                        self._wake_next()
                        break
                    self._idle_threads += 1
                    self._work.wait()  # returns only when notified (``_wake_next``): one wake-up taken
                    self._idle_threads -= 1
                    self._waking -= 1
            busy = True  # counted in ``_busy`` by the branch taken (``_step`` counts itself after its claim)
            if item is None:
                self._step(fresh, done)
            else:
                self._run(item)

    def _run(self, item: Item) -> None:
        try:
            if item.claimed:
                self._run_claimed(item)
            else:
                self._run_single(item)
        except Exception:
            logger.exception("group_item_failed task=%s", item.attempt.task_id)
            item.release()
            self._end(item)

    def _run_single(self, item: Item) -> None:
        """Anything but a plain 'run' claim (finished, busy, poison, stale, ...): the single path decides."""
        attempt = item.attempt
        task = attempt.task
        task.request_stack.push(attempt.request)  # the attempt's own request: no copy
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
        task.request_stack.push(attempt.request)  # the attempt's own request: no copy
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
        with self._work:  # this thread finishes it on its next turn, unless another call takes it first
            self._pending.append((item, result, result_json))

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
        task.request_stack.push(attempt.request)  # as in Celery's trace: ``sender.request`` is the task's
        try:
            if state == states.RETRY:
                celery_signals.task_retry.send(sender=task, request=attempt.request, reason=exc, einfo=None)
            else:
                celery_signals.task_failure.send(sender=task, task_id=attempt.task_id, exception=exc, args=(),
                                                 kwargs={"payload": attempt.payload}, traceback=None, einfo=None)
        finally:
            task.pop_request()
        self._end(item, state=state)

    def _finish(self, done: list[tuple[Item, Any, str]], replies: list[str] | None, finished_at: float) -> None:
        """The successes' outcomes in Redis (``replies``: already recorded by the claim's call; else in a
        ``finish_batch`` call here), then their rows in one statement, acks, events and signals."""
        try:
            if replies is None:
                terms = _finish_terms()
                replies = until_answered(functools.partial(
                    finish_batch, items=_done_items(done), now=finished_at, tombstone_ttl_s=terms.tombstone_ttl_s,
                    queued_lease_ms=terms.queued_lease_ms, settle_lease_ms=terms.settle_lease_ms, metric_field="",
                    execution=Latencies({}, 0.0), busy_s=0.0, queue=Latencies({}, 0.0), counted=False,
                ), "finish_batch", done[0][0].attempt.task_id)
        except Exception:
            logger.exception("group_finish_failed items=%d", len(done))
            for item, _, _ in done:
                item.release()
                self._end(item)
            return
        by_field: dict[str, list[float]] = {}
        ok_by_field: dict[str, int] = {}
        rows = []
        for (item, result, _), reply in zip(done, replies, strict=True):
            item.release()
            if reply == "taken":
                logger.warning("finish_skipped task=%s (taken by another worker)", item.attempt.task_id)
                self._end(item)
                continue
            field = item.attempt.field
            by_field.setdefault(field, []).append(finished_at - item.attempt.started_at)
            ok_by_field[field] = ok_by_field.get(field, 0) + (reply == "ok")
            item.attempt.request.dispatch_settle = (item.attempt.record, states.SUCCESS)
            item.attempt.emit_finished(finished_at)
            rows.append((item, result, states.SUCCESS))
        for field, elapsed in by_field.items():
            count_batch(field, ok_by_field[field], Latencies.of(elapsed), sum(elapsed), Latencies({}, 0.0),
                        finished_at)
        self._rows(rows)
        self._ack([item for item, result, _ in rows if self._close(item, value=result, state=states.SUCCESS)])

    def _rows(self, rows: list[tuple[Item, Any, str]]) -> None:
        """Result rows in one statement; then their finished records may be settled."""
        if rows:
            backend = rows[0][0].attempt.task.backend
            terms = self._row_terms
            if terms is None:
                terms = self._row_terms = results.RowTerms.of(backend)
            results.store_rows(backend, [
                results.Outcome(item.attempt.task_id, item.name, item.attempt.request, value, state)
                for item, value, state in rows], rows[0][0].attempt.book, terms)

    def _end(self, item: Item, value: Any = None, state: str | None = None) -> None:
        """The message is done with: events and signals sent, then acked (its record tracks the task from here)."""
        if self._close(item, value, state):
            self._ack([item])

    def _close(self, item: Item, value: Any = None, state: str | None = None) -> bool:
        """Its events and signals sent; False if it was done with already (nothing sent, nothing to ack)."""
        if item.done:
            return False
        item.done = True
        attempt = item.attempt
        tracing.end_attempt(attempt)
        if state == states.SUCCESS and self.events is not None:
            runtime = time.time() - attempt.started_at if attempt.started_at else 0.0
            self.events.send("task-succeeded", uuid=attempt.task_id, result=_short_repr(value), runtime=runtime)
        task = attempt.task
        # The signals run after the handler, maybe in another thread (a group's finish): with the task's
        # request pushed, as Celery's trace sends them, so a receiver's ``sender.request`` is this task's.
        task.request_stack.push(attempt.request)
        try:
            if state == states.SUCCESS:
                celery_signals.task_success.send(sender=task, result=value)
            if item.claimed or state is not None:
                celery_signals.task_postrun.send(sender=task, task_id=attempt.task_id, task=task, args=(),
                                                 kwargs={"payload": attempt.payload}, retval=value, state=state)
        finally:
            task.pop_request()
        return True

    def _ack(self, items: list[Item]) -> None:
        """Their messages acked, in order, from the event loop's thread as Celery's dispatch acks: the ones the
        pop handed over (``_take``) in one callback (a group's successes: one ``call_soon_ack`` and one wake-up
        of the loop, not one a message), each of the others by its own promise (Celery's, which may restore
        the prefetch count after a reconnect). Stopping, here (the event loop waits for ``drain``; a leased
        message's ack is in memory)."""
        if not items:
            return
        errors = self.connection_errors
        try:
            if self.stopping:
                _ack_messages([item.message for item in items], errors)
            else:
                handed = [item.message for item in items if item.ack is None]
                if handed:
                    self.consumer.call_soon_ack(_ack_messages, handed, errors)
                for item in items:
                    if item.ack is not None:
                        item.ack(logger, errors)
        except Exception:
            logger.warning("ack_failed tasks=%s", ",".join(item.attempt.task_id for item in items), exc_info=True)
        with self._mutex:
            self._in_flight -= len(items)
            if self._in_flight <= 0:
                self._idle.notify_all()

    def _acker(self, item: Item) -> Callable[..., Any]:
        """The item's ack as Celery's dispatch would have given it (a ``Request``'s ``on_ack``)."""
        if item.ack is not None:
            return item.ack
        return functools.partial(self.consumer.call_soon_ack, item.message.ack_log_error)

    def _rejecter(self, item: Item) -> Callable[..., Any]:
        if item.reject is not None:
            return item.reject
        return functools.partial(self.consumer.call_soon_ack, item.message.reject_log_error)

    def _hand_back(self, item: Item) -> None:
        """Not claimed, and the worker is stopping: the message goes back to its lane for another worker."""
        item.done = True
        try:
            self._rejecter(item)(logger, self.connection_errors, requeue=True)
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


#: What ``request_context`` adds to a request, the fields Celery's ``Context`` keeps among its custom headers too.
_PLATFORM_FIELDS = ("periodic_task_name", "meta", "dispatch_settle")


def _loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # an int past 64 bits: json reads what the caller's json wrote
        return json.loads(text)


def request_context(**fields: Any) -> CeleryContext:
    """A task request (``task.request`` while its handler runs) with the platform's fields: what
    ``CeleryContext(**fields, periodic_task_name=None, meta={}, dispatch_settle=None)`` makes, without its
    per-call scan for custom headers (those are always the platform's three fields here)."""
    request = CeleryContext.__new__(CeleryContext)
    meta: dict[str, Any] = {}
    request.__dict__.update(fields, periodic_task_name=None, meta=meta, dispatch_settle=None,
                            headers={"periodic_task_name": None, "meta": meta, "dispatch_settle": None})
    if "timelimit" in fields:  # as Context.update: the limits it names, cleared when it names none
        limits = fields["timelimit"]
        both = isinstance(limits, (list, tuple)) and len(limits) >= 2
        request.time_limit, request.soft_time_limit = (limits[0], limits[1]) if both else (None, None)
    return request


def _ack_messages(messages: list[Any], errors: tuple[type[BaseException], ...]) -> None:
    """Ack each of ``messages`` (kombu's ``ack_log_error``), on the event loop's thread: one failing does not
    keep the others from theirs."""
    for message in messages:
        try:
            message.ack_log_error(logger, errors)
        except Exception:
            logger.warning("ack_failed tag=%s", getattr(message, "delivery_tag", "?"), exc_info=True)


def _prefetch_settled(consumer: Any) -> bool:
    """False while Celery's dispatch restores its prefetch count after a reconnect, on the next acks
    (``Consumer.create_task_handler``): then the messages take that dispatch."""
    return (getattr(consumer, "_maximum_prefetch_restored", True)
            or getattr(consumer, "restart_count", 0) <= 0
            or getattr(consumer, "_new_prefetch_count", 0) > getattr(consumer, "max_prefetch_count", 0))


def _done_items(done: list[tuple[Item, Any, str]]) -> list[DoneItem]:
    # A type that keeps a success's result row needs no tombstone (docs/redis-budget.md).
    return [DoneItem(item.attempt.task_id, item.attempt.record, item.attempt.env.chat, bounded_result(result_json),
                     item.attempt.owner, "" if results.keeps_row(item.name, states.SUCCESS) else "1")
            for item, _, result_json in done]


def _finish_terms() -> FinishTerms:
    return FinishTerms(tombstone_ttl_s(), int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
                       int(settings.DISPATCH_LEASE_S * 1000))


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 1024 else text[:1021] + "..."

