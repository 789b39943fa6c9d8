"""Bump the config version in Redis after any configuration change is committed.

Callers and workers cache the configuration and compare their version inside
the Lua calls they already make, so a change applies to the next dispatch and
the next execution without an extra round trip and without restarts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.db import transaction
from django.db.models import F
from django.db.models.signals import post_delete, post_save

logger = logging.getLogger(__name__)

#: Seconds slept before each new attempt to bump the version (then it gives up and raises).
BUMP_RETRY_DELAYS_S = (0.05, 0.2, 0.5)


class ConfigVersionNotPublished(RuntimeError):
    """The change is saved, but Redis did not get the new config version."""


#: Where a failed bump of a change made in this context is reported instead of raised (the admin's warning).
_report_bump_failure: ContextVar[Callable[[ConfigVersionNotPublished], None] | None] = ContextVar(
    "report_bump_failure", default=None)


@contextmanager
def bump_failures_reported_to(report: Callable[[ConfigVersionNotPublished], None]) -> Iterator[None]:
    """Changes saved inside this block report a failed bump (run at their commit) to ``report``.

    The bump runs after the commit, when a raise can no longer undo the change
    and would only turn the admin's redirect into a 500 page.
    """
    token = _report_bump_failure.set(report)
    try:
        yield
    finally:
        _report_bump_failure.reset(token)


def bump_config_version() -> None:
    """INCR the version in Redis, a few times if need be; raise when Redis never answers.

    A swallowed failure used to leave running processes on the old
    configuration (a closed lane kept admitting) while the save reported
    success. They still converge (tasks.config compares the database's
    revision every few seconds), but the operator is told.
    """
    import redis

    from lanes import keys
    from lanes.redis_client import get_redis

    for delay in (*BUMP_RETRY_DELAYS_S, None):
        try:
            get_redis().incr(keys.CONFIG_VERSION)
            return
        except redis.RedisError as exc:
            error = exc
            logger.warning("config_version_bump_retry error=%r", exc)
            if delay is not None:
                time.sleep(delay)
    logger.error("config_version_bump_failed error=%r", error)
    raise ConfigVersionNotPublished(
        f"the configuration change is saved, but Redis did not get the new config version ({error}); "
        "running workers and callers pick it up from the database within seconds"
    ) from error


def bump_db_revision() -> None:
    """Count the change in the database, inside the change's own transaction."""
    from lanes.models import ConfigRevision

    if not ConfigRevision.objects.filter(pk=1).update(revision=F("revision") + 1):
        ConfigRevision.objects.get_or_create(pk=1, defaults={"revision": 1})


def _on_change(sender, **kwargs) -> None:
    bump_db_revision()
    report = _report_bump_failure.get()
    transaction.on_commit(bump_config_version if report is None else lambda: _bump_or_report(report))


def _bump_or_report(report: Callable[[ConfigVersionNotPublished], None]) -> None:
    try:
        bump_config_version()
    except ConfigVersionNotPublished as exc:
        report(exc)


def connect(*models) -> None:
    for model in models:
        post_save.connect(_on_change, sender=model, dispatch_uid=f"cfg-save-{model.__name__}")
        post_delete.connect(_on_change, sender=model, dispatch_uid=f"cfg-del-{model.__name__}")


def _connect_all() -> None:
    from lanes.models import Lane
    from tasks.models import RetryPolicy, TaskType

    connect(Lane, RetryPolicy, TaskType)


_connect_all()
