"""Upkeep of the API's own rows: the audit kept ``DISPATCH_API_AUDIT_RETENTION_DAYS`` days (beat, hourly)."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from api.models import DispatchAudit

logger = logging.getLogger(__name__)

#: Rows one DELETE removes at most, so a long backlog never holds a big lock.
PURGE_BATCH = 1000


def purge_audit(retention_days: int | None = None, batch_size: int = PURGE_BATCH) -> int:
    """Delete audit rows older than the retention; returns how many went."""
    days = settings.DISPATCH_API_AUDIT_RETENTION_DAYS if retention_days is None else retention_days
    cutoff = timezone.now() - timedelta(days=days)
    removed = 0
    while True:
        ids = list(DispatchAudit.objects.filter(created_at__lt=cutoff).values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        removed += DispatchAudit.objects.filter(pk__in=ids).delete()[0]
    if removed:
        logger.info("api_audit_purged rows=%d older_than_days=%d", removed, days)
    return removed


@shared_task(name="api.purge_audit", ignore_result=True)
def purge_audit_task() -> int:
    return purge_audit()
