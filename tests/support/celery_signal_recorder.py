"""Test-only receivers of Celery's own task signals, loaded in workers through
``DISPATCH_HOOK_MODULES=tests.support.celery_signal_recorder``: each signal a task
gets is written to Redis (one list for the worker's process) where the test reads it.
"""

from __future__ import annotations

import json

from celery import signals

from lanes import keys

KEY = f"{keys.PREFIX}test:celery-signals"


def _push(signal: str, task_id: str, name: str) -> None:
    from lanes.redis_client import get_redis

    client = get_redis()
    client.rpush(KEY, json.dumps({"signal": signal, "id": task_id, "name": name}))
    client.expire(KEY, 3600)


def received(sender=None, request=None, **kwargs) -> None:
    _push("task_received", request.id, request.name)


def prerun(sender=None, task_id=None, task=None, **kwargs) -> None:
    _push("task_prerun", task_id, task.name)


def postrun(sender=None, task_id=None, task=None, **kwargs) -> None:
    _push("task_postrun", task_id, task.name)


def success(sender=None, **kwargs) -> None:
    _push("task_success", sender.request.id, sender.name)


def failure(sender=None, task_id=None, **kwargs) -> None:
    _push("task_failure", task_id, sender.name)


_RECEIVERS = {signals.task_received: received, signals.task_prerun: prerun, signals.task_postrun: postrun,
              signals.task_success: success, signals.task_failure: failure}


def connect() -> None:
    for signal, receiver in _RECEIVERS.items():
        signal.connect(receiver, weak=False, dispatch_uid=f"test-celery-{receiver.__name__}")


def read(client) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(KEY, 0, -1)]


connect()
