"""Task events for Flower at a fraction of their cost: gathered, folded per task run, sent in batches.

Celery sends three events for every task (received, started, succeeded), and
with the event loop's eager flush nearly each one became a Redis ``PUBLISH``
and a message for Flower to decode. Measured under ``make run``'s load test,
those events cost more CPU than the tasks (233 tasks/s completed with them,
400/s without). Here a worker keeps its task events for up to
:data:`EVENT_FLUSH_INTERVAL` seconds (or :data:`EVENT_BUFFER_LIMIT` events)
and publishes them as one ``task.multi`` message from the dispatcher's own
thread (:meth:`EventDispatcher.flush_later`: the event loop does not wait for
Redis's answer), after
:func:`fold_task_events` has made each run of a task that ends in the batch
one event: its ending event (succeeded, failed, retried, revoked),
carrying the fields of the opening events before it (name, args, kwargs,
retries, …) and their times as ``received`` / ``started``, which is what
Celery's event state records from them. A run still open at a flush whose
``task-received`` is younger than :data:`EVENT_HOLD` stays in the buffer for
the next flush, so that a short task that straddles two batches is still one
event; an older open run is sent as it is (Flower shows a long task received,
then started, as Celery's would). A retry's new delivery is a new run: it is
never merged into the old attempt's end, and a ``task-rejected`` is never
folded into (Celery's state ranks it below received and started, so it keeps
the earlier state; folded, the task would read rejected).

What Flower shows does not change: every task by name with its final state,
runtime, received / started / succeeded times and worker, and the runtime
histogram. What changes: Flower sees a short task up to
``EVENT_FLUSH_INTERVAL + EVENT_HOLD`` seconds after it was received
(0.1 s before; a task still running past the hold shows received then started),
``flower_events_total`` counts one ending event for most tasks
(few ``task-received`` / ``task-started``), and ``flower_task_prefetch_time_seconds``
is not set from a folded task (it is set only by a ``task-started`` event).
``flower_worker_prefetched_tasks`` stays right: a ``task-received`` is folded
only together with the event that would take it off that gauge (its run's
``task-started``, or an ending Flower does not count), and a ``task-started``
whose ``task-received`` went in an earlier batch is always sent. A warm
shutdown publishes everything buffered, held runs included, once the tasks it
let end have ended (:meth:`EventDispatcher.flush_all`, called by the consumer
before Celery closes the events connection).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from celery.app.events import Events as CeleryEvents
from celery.events.dispatcher import EventDispatcher as CeleryEventDispatcher

logger = logging.getLogger(__name__)

#: Seconds a worker gathers task events before publishing them (Flower sees them at most this late).
EVENT_FLUSH_INTERVAL = 0.1

#: Seconds an open run's events may wait in the buffer for their run's end (then they go as they are).
#: Under a backlog a task waits in the prefetch window (received, not started) for a few tenths of a
#: second: held that long, its three events still go as one. Open runs held are bounded by that window.
EVENT_HOLD = 1.0

#: Events that make a buffer go at once, whatever the interval (one ``task.multi`` message).
EVENT_BUFFER_LIMIT = 400

#: The event whose time each folded event's kind is kept under, as Celery's event state names it.
_TIME_FIELD = {"task-received": "received", "task-started": "started"}

#: The events that end a run of a task on a worker (what comes after them for the task is a new delivery).
_ENDING = frozenset({"task-succeeded", "task-failed", "task-retried", "task-rejected", "task-revoked"})

#: Endings on which Flower takes a task that never started off its prefetched gauge (never folded into then).
_UNSTARTED_ENDING = frozenset({"task-rejected", "task-revoked"})

#: An ending Celery's state ranks below received and started (it keeps the task's earlier state): never folded into.
_UNRANKED_ENDING = frozenset({"task-rejected"})

#: Opening fields Celery's state reads as None when an event does not carry them.
_NONE_BY_DEFAULT = frozenset({"eta", "expires", "parent_id", "root_id", "exchange", "routing_key", "client"})

#: What an event says of itself, never carried into the event it folds into.
_OWN_FIELDS = frozenset({"type", "timestamp", "clock", "local_received"})


def fold_task_events(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` with each run of a task that ends among them folded into its ending event; nothing held."""
    return fold_batch(list(events), hold_after=None)[0]


def fold_batch(events: Sequence[dict[str, Any]],
               hold_after: float | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A batch as (to send, to hold): runs ending in it folded, young open runs held.

    An open run (a ``task-received``, maybe a ``task-started``, no end yet) is
    held when its ``task-received`` is at or after ``hold_after`` (never when it
    is ``None``). Folded events take their ending's place, so the order of
    events between tasks and within a task is kept.
    """
    runs: list[list[int]] = []  # indices in events, a run each
    open_run: dict[str, int] = {}  # uuid -> its open run in runs
    kinds: list[str] = []  # "end", "open" or "plain" per run
    plain: list[int] = []  # events of no run
    for i, event in enumerate(events):
        uuid, kind = event.get("uuid"), event.get("type")
        if not uuid or not isinstance(kind, str) or not kind.startswith("task-"):
            plain.append(i)
            continue
        at = open_run.get(uuid)
        if at is None:
            at = open_run[uuid] = len(runs)
            runs.append([])
            kinds.append("open")
        runs[at].append(i)
        if kind in _ENDING or kind not in _TIME_FIELD:
            kinds[at] = "end" if kind in _ENDING else "plain"
            del open_run[uuid]
    send: dict[int, dict[str, Any]] = {i: events[i] for i in plain}
    held: list[dict[str, Any]] = []
    for run, kind in zip(runs, kinds, strict=True):
        first, last = events[run[0]], events[run[-1]]
        types = {events[i]["type"] for i in run}
        if kind == "end" and len(run) > 1 and "task-received" in types and last["type"] not in _UNRANKED_ENDING and (
                last["type"] not in _UNSTARTED_ENDING or "task-started" in types):
            send[run[-1]] = _merged([events[i] for i in run])
        elif (kind == "open" and hold_after is not None and first["type"] == "task-received"
              and first.get("timestamp", 0.0) >= hold_after):
            held.extend(events[i] for i in run)
        else:
            send.update((i, events[i]) for i in run)
    return [send[i] for i in sorted(send)], held


def _merged(run: list[dict[str, Any]]) -> dict[str, Any]:
    # An opening field that is None (eta, expires, parent_id) is what Celery's state holds without it:
    # left out of a first delivery's event, it is neither encoded by the worker nor decoded by Flower.
    merged: dict[str, Any] = {}
    for event in run[:-1]:
        merged.update((key, value) for key, value in event.items() if key not in _OWN_FIELDS)
        merged[_TIME_FIELD[event["type"]]] = event["timestamp"]
    if not merged.get("retries"):  # a first delivery: no earlier value of the task's to overwrite
        for key in [key for key, value in merged.items() if value is None and key in _NONE_BY_DEFAULT]:
            del merged[key]
    merged.update(run[-1])
    return merged


class EventDispatcher(CeleryEventDispatcher):
    """Celery's dispatcher, with a larger buffer that is folded before it is published."""

    def __init__(self, *args: Any, buffer_limit: int = EVENT_BUFFER_LIMIT, **kwargs: Any) -> None:
        self.holding = 0  # events the last flush kept back (the flusher thread flushes again for them)
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._flusher_lock = threading.Lock()
        super().__init__(*args, buffer_limit=buffer_limit, **kwargs)

    def flush_later(self) -> None:
        """Have this dispatcher's own thread publish the buffer now, so the event loop never waits for it.

        With ``appendfsync always`` Redis answers a ``PUBLISH`` after its loop's fsync: on the event loop
        that wait held up the next pop. The thread waits for Redis with the GIL released; its folding and
        encoding are the CPU they were.
        """
        if self._flusher is None:
            with self._flusher_lock:
                if self._flusher is None and not self._closed:
                    self._flusher = threading.Thread(target=self._flush_forever, name="task-events", daemon=True)
                    self._flusher.start()
        self._wake.set()

    def _flush_forever(self) -> None:
        while True:
            # Held open runs go at the latest one interval later, new events or none.
            self._wake.wait(EVENT_FLUSH_INTERVAL if self.holding else None)
            self._wake.clear()
            if self._flusher is not threading.current_thread():  # closed (an enable() may start another)
                return
            try:
                self.flush()
            except Exception:  # Celery keeps what it could not publish (buffer_while_offline); the loop goes on
                logger.warning("task_events_flush_failed", exc_info=True)

    def close(self) -> None:
        super().close()
        with self._flusher_lock:
            self._flusher = None
        self._wake.set()

    def flush(self, errors: bool = True, groups: bool = True) -> None:
        super().flush(errors=errors, groups=False)
        if groups:
            self._flush_groups(hold_after=time.time() - EVENT_HOLD)

    def flush_all(self) -> None:
        """Publish every buffered event now, open runs included: no later flush will come (a warm shutdown)."""
        super().flush(groups=False)
        self._flush_groups(hold_after=None)

    def _flush_groups(self, hold_after: float | None) -> None:
        with self.mutex:
            if self._closed:
                return
            holding = 0
            for group, events in self._group_buffer.items():
                # Other threads append while this runs: take what is there, leave what comes after.
                count = len(events)
                if not count:
                    continue
                send, held = fold_batch(events[:count], hold_after)
                if send:
                    self._publish(send, self.producer, f"{group}.multi")
                del events[:count]
                events[:0] = held
                holding += len(held)
            self.holding = holding


class Events(CeleryEvents):
    """``app.events`` with :class:`EventDispatcher` (wired in ``dispatchsite.celery``)."""

    dispatcher_cls = "tasks.worker_events:EventDispatcher"
