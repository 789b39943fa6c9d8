"""Bump the config version in Redis after any configuration change is committed.

Callers and workers cache the configuration and compare their version inside
the Lua calls they already make, so a change applies to the next dispatch and
the next execution without an extra round trip and without restarts.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.signals import post_delete, post_save

logger = logging.getLogger(__name__)


def bump_config_version() -> None:
    from lanes import keys
    from lanes.redis_client import get_redis

    try:
        get_redis().incr(keys.CONFIG_VERSION)
    except Exception:
        logger.exception("config_version_bump_failed")


def _on_change(sender, **kwargs) -> None:
    transaction.on_commit(bump_config_version)


def connect(*models) -> None:
    for model in models:
        post_save.connect(_on_change, sender=model, dispatch_uid=f"cfg-save-{model.__name__}")
        post_delete.connect(_on_change, sender=model, dispatch_uid=f"cfg-del-{model.__name__}")


def _connect_all() -> None:
    from lanes.models import Lane
    from tasks.models import RetryPolicy, TaskType

    connect(Lane, RetryPolicy, TaskType)


_connect_all()
