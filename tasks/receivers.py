"""The tasks app's signal receivers, all connected by one ``connect()`` from ``TasksConfig.ready()``.

- Every rejection is kept among the last ones for the dashboard, and those
  found before the admission script (unknown type, invalid payload, ...),
  which no script counted, are counted too: ``count_rejection``, one pipelined
  round trip (``lanes.metrics.record_rejection``). Rejections are the unhappy
  path; an accepted task's counts are kept in process (``lanes.counters``).
- A message the transport could not decode becomes a ``malformed`` dead letter.
- A save or delete of a retry policy, task type, limit or a type's limit bumps the config version
  (``lanes.config_version``; the lanes app connects ``Lane`` the same way).
- A deleted schedule takes its derived PeriodicTask with it.
- A setting changed (``override_settings``) is read again by the next dispatch
  (``admission.dispatch_settings``).
- A worker process settles its finished records before it exits; beat runs the
  maintenance loop in a thread.

Nothing here is connected by importing this module.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery import signals as celery_signals
from django.core.signals import setting_changed
from django.db.models.signals import post_delete

from lanes import config_version, counters, leases
from lanes.metrics import record_rejection
from lanes.redis_client import get_redis
from lanes.signals import message_unreadable
from tasks import admission, dead_letters, history, maintenance
from tasks.models import Limit, RetryPolicy, Schedule, TaskType, TaskTypeLimit, drop_periodic_task
from tasks.signals import TaskInfo, task_rejected

logger = logging.getLogger(__name__)


def count_rejection(sender: object, info: TaskInfo, **kwargs: object) -> None:
    try:
        record_rejection(get_redis(), info.lane, info.type, info.reason, info.detail, time.time())
    except redis.RedisError as exc:  # Redis down: the dispatch already answered; do not add noise
        logger.debug("rejection_not_counted reason=%s error=%s", info.reason, exc)


def record_unreadable_message(sender: object, task_id: str, message: str, exc: BaseException,
                              **kwargs: object) -> None:
    """Keep a message the transport dropped as a ``malformed`` dead letter."""
    dead_letters.record(task_id=task_id, task_type="?", lane="", reason="malformed", message=message, exc=exc)


def settle_before_exit(**_: Any) -> None:
    leases.current().settle_now()
    counters.flush_quietly()  # a pool child exits without atexit hooks: its last counts go now
    history.flush_quietly()


def connect() -> None:
    """Connect every receiver above (idempotent: each has a ``dispatch_uid``)."""
    task_rejected.connect(count_rejection, dispatch_uid="lanes.count_rejection")
    setting_changed.connect(admission.forget_settings, dispatch_uid="tasks.admission.forget_settings")
    message_unreadable.connect(record_unreadable_message, dispatch_uid="tasks.record_unreadable_message")
    config_version.connect(RetryPolicy, TaskType, Limit, TaskTypeLimit)
    celery_signals.worker_process_shutdown.connect(settle_before_exit, weak=False,
                                                   dispatch_uid="tasks.settle_before_exit")
    celery_signals.worker_shutdown.connect(settle_before_exit, weak=False, dispatch_uid="tasks.settle_before_exit")
    post_delete.connect(drop_periodic_task, sender=Schedule, dispatch_uid="tasks.drop_periodic_task")
    celery_signals.beat_init.connect(maintenance.maintain_in_beat, weak=False, dispatch_uid="tasks.maintain_in_beat")
