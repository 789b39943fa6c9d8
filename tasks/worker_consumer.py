"""The worker's consumer: Celery's, plus a dead letter for every message it cannot run.

Celery logs and drops undecodable (e.g. pickle), unknown and invalid messages;
operators should see them, so each also becomes a ``malformed`` dead letter.
"""

from __future__ import annotations

import logging
import uuid

from celery.worker.consumer import Consumer as CeleryConsumer

from tasks import dead_letters

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
