"""Built-in subscribers to the lifecycle signals (tasks.hooks).

Accepted tasks are counted inside the Lua scripts, in the Redis call each step
already makes. Rejections found before that call (unknown type, invalid
payload, ...) never reach a script, so this receiver counts them with one
pipelined round trip; it also keeps the last rejections for the dashboard.
Rejections are the unhappy path: the happy path pays nothing here.
"""

from __future__ import annotations

import logging
import time

import redis

from tasks.hooks import TaskInfo, task_rejected

logger = logging.getLogger(__name__)


def count_rejection(sender: object, info: TaskInfo, **kwargs: object) -> None:
    from lanes.metrics import record_rejection
    from lanes.redis_client import get_redis

    try:
        record_rejection(get_redis(), info.lane, info.type, info.reason, info.detail, time.time())
    except redis.RedisError as exc:  # Redis down: the dispatch already answered; do not add noise
        logger.debug("rejection_not_counted reason=%s error=%s", info.reason, exc)


task_rejected.connect(count_rejection, dispatch_uid="lanes.count_rejection")
