"""Task events for Flower at a fraction of their cost: gathered, merged per task, sent in batches.

Celery sends three events for every task (received, started, succeeded), and
with the event loop's eager flush nearly each one became a Redis ``PUBLISH``
and a message for Flower to decode. Measured under ``make run``'s load test,
those events cost more CPU than the tasks (233 tasks/s completed with them,
400/s without). Here a worker keeps its task events for up to
:data:`EVENT_FLUSH_INTERVAL` seconds (or :data:`EVENT_BUFFER_LIMIT` events),
folds the events of one run of one task that fall in the same batch into its
last one, and publishes the batch as one ``task.multi`` message.

What Flower shows does not change: a folded event carries the earlier events'
fields (name, args, kwargs, retries, …) and their times as ``received`` /
``started``, which is what Celery's event state records from them. A task
that runs longer than a batch still shows as received and then started. Only
event counts by type (Flower's ``flower_events_total``) see fewer received and
started events.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableSequence
from typing import Any

from celery.app.events import Events as CeleryEvents
from celery.events.dispatcher import EventDispatcher as CeleryEventDispatcher

#: Seconds a worker gathers task events before publishing them (Flower sees them at most this late).
EVENT_FLUSH_INTERVAL = 0.1

#: Events that make a buffer go at once, whatever the interval (one ``task.multi`` message).
EVENT_BUFFER_LIMIT = 400

#: The event whose time each folded event's kind is kept under, as Celery's event state names it.
_TIME_FIELD = {"task-received": "received", "task-started": "started"}

#: What an event says of itself, never carried into the event it folds into.
_OWN_FIELDS = frozenset({"type", "timestamp", "clock", "local_received"})


def fold_task_events(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One event per run of a task in ``events``: its last, carrying the fields of those before it.

    Only a run's opening events fold (received, started); an event after an
    ending one (succeeded, failed, retried, revoked, rejected) starts a new
    run, so a retry's new delivery is never merged into the old attempt's end.
    The folded event takes the place of the last one, keeping the order of
    events between tasks.
    """
    out: list[dict[str, Any] | None] = []
    open_runs: dict[str, int] = {}  # uuid -> index in out of its run's latest (opening) event
    for event in events:
        uuid = event.get("uuid")
        at = open_runs.pop(uuid, None) if uuid else None
        if at is not None:
            earlier = out[at]
            out[at] = None
            assert earlier is not None
            merged = {key: value for key, value in earlier.items() if key not in _OWN_FIELDS}
            merged[_TIME_FIELD[earlier["type"]]] = earlier["timestamp"]
            merged.update(event)
            event = merged
        if uuid and event.get("type") in _TIME_FIELD:
            open_runs[uuid] = len(out)
        out.append(event)
    return [event for event in out if event is not None]


class EventDispatcher(CeleryEventDispatcher):
    """Celery's dispatcher, with a larger buffer that is folded before it is published."""

    def __init__(self, *args: Any, buffer_limit: int = EVENT_BUFFER_LIMIT, **kwargs: Any) -> None:
        super().__init__(*args, buffer_limit=buffer_limit, **kwargs)

    def flush(self, errors: bool = True, groups: bool = True) -> None:
        if groups:
            with self.mutex:
                for events in self._group_buffer.values():
                    _fold_in_place(events)
        super().flush(errors=errors, groups=groups)


def _fold_in_place(events: MutableSequence[dict[str, Any]]) -> None:
    # Other threads append while this runs: fold the part read, leave what came after.
    count = len(events)
    if count > 1:
        events[:count] = fold_task_events(events[:count])


class Events(CeleryEvents):
    """``app.events`` with :class:`EventDispatcher` (wired in ``dispatchsite.celery``)."""

    dispatcher_cls = "tasks.worker_events:EventDispatcher"
