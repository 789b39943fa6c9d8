"""The worker's consumer: Celery's, plus a dead letter for every message it cannot run,
and task events published in batches.

Celery logs and drops undecodable (e.g. pickle), unknown and invalid messages;
operators should see them, so each also becomes a ``malformed`` dead letter.

With task events on (Flower), Celery publishes its event buffer on the event
loop's next turn, under load nearly one Redis ``PUBLISH`` per event; here the
loop has the dispatcher's own thread publish them at most every ``EVENT_FLUSH_INTERVAL``
seconds (:mod:`tasks.worker_events` says why and what Flower sees).
"""

from __future__ import annotations

import logging
import time
import uuid

from celery.worker.consumer import Consumer as CeleryConsumer
from django.conf import settings

from tasks import dead_letters, grouping
from tasks.worker_events import EVENT_FLUSH_INTERVAL, EventDispatcher

logger = logging.getLogger(__name__)


def _record(message, why: str) -> None:
    try:
        headers = getattr(message, "headers", None) or {}
        delivery = getattr(message, "delivery_info", None) or {}
        body = getattr(message, "body", b"")
        preview = body[:500] if isinstance(body, (bytes, str)) else repr(body)[:500]
        dead_letters.record(
            task_id=str(headers.get("id") or f"malformed-{uuid.uuid4()}")[:64],
            task_type=str(headers.get("task") or "?")[:100],
            lane=str(delivery.get("routing_key") or "")[:64],
            reason="malformed",
            message=f"{why}; content-type={getattr(message, 'content_type', None)!r}; body starts {preview!r}",
        )
    except Exception:
        logger.exception("malformed_record_failed")


class Consumer(CeleryConsumer):
    _events_flush_due = False  # a flush is scheduled on the event loop
    _events_flushed_at = 0.0

    def __init__(self, *args, initial_prefetch_count=2, prefetch_multiplier=1, **kwargs):
        # A grouping worker (tasks.grouping) claims what it receives at once and runs it on threads
        # of its own: a deeper prefetch lets it take the next messages while the last ones finish
        # (each hop between its threads waits for the scheduler), never more than it has claimed.
        pool = kwargs.get("pool")
        if settings.DISPATCH_GROUPING and type(pool).__module__ == "celery.concurrency.thread":
            deeper = max(1, settings.DISPATCH_GROUP_PREFETCH)
            initial_prefetch_count = initial_prefetch_count * deeper // max(1, prefetch_multiplier)
            prefetch_multiplier = deeper
        super().__init__(*args, initial_prefetch_count=initial_prefetch_count,
                         prefetch_multiplier=prefetch_multiplier, **kwargs)

    def on_send_event_buffered(self) -> None:
        # Any thread (pool threads send task-started/succeeded). The flag is
        # cleared before a flush reads the buffer, so an event appended after
        # that read sees it clear and schedules the next flush: none is stranded.
        if self.hub and not self._events_flush_due:
            self._events_flush_due = True
            self.hub.call_soon(self._flush_events_promise)

    def _flush_events(self) -> None:
        # The event loop's thread only (call_soon / call_later callbacks).
        wait = self._events_flushed_at + EVENT_FLUSH_INTERVAL - time.monotonic()
        if wait > 0 and self.hub:
            self.hub.call_later(wait, self._flush_events_promise)
            return
        self._events_flush_due = False
        self._events_flushed_at = time.monotonic()
        dispatcher = self.event_dispatcher
        if isinstance(dispatcher, EventDispatcher):
            dispatcher.flush_later()  # published on its thread: the loop does not wait for Redis's answer
        else:
            super()._flush_events()

    def stop(self) -> None:
        self._drain_groups()
        super().stop()

    def shutdown(self) -> None:
        self._drain_groups()
        super().shutdown()

    def _drain_groups(self) -> None:
        # A warm shutdown lets the grouped tasks this worker took end (bounded by a lease: past it,
        # their leases bring them back anyway), as Celery lets its pool's tasks end.
        runner = grouping.Runner.existing(self)
        if runner is not None and not runner.drain(settings.DISPATCH_LEASE_S):
            logger.warning("group_drain_timed_out: the tasks still running come back by their leases")
        # The events those tasks sent (and the runs held for their end) go before Celery closes the events
        # connection: its dispatcher's close publishes nothing.
        dispatcher = getattr(self, "event_dispatcher", None)
        if isinstance(dispatcher, EventDispatcher) and dispatcher.enabled:
            try:
                dispatcher.flush_all()
            except Exception:
                logger.warning("task_events_final_flush_failed", exc_info=True)

    def on_decode_error(self, message, exc):
        _record(message, f"cannot decode the message: {exc}")
        super().on_decode_error(message, exc)

    def on_unknown_message(self, body, message):
        _record(message, "not a Celery task message")
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body, message, exc):
        _record(message, f"unknown task: {exc}")
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body, message, exc):
        _record(message, f"invalid task message: {exc}")
        super().on_invalid_task(body, message, exc)
