"""Test-only receivers of the lifecycle signals, loaded in workers through
``DISPATCH_HOOK_MODULES=tests.support.hook_recorder``.

Worker-side signals fire inside the worker's pool processes, so each event is
written to Redis (a list per task type) where the test process reads it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from lanes import keys
from tasks.signals import TaskInfo, task_finished, task_queued, task_rejected, task_started


def events_key(type_name: str) -> str:
    return f"{keys.PREFIX}test:hooks:{type_name}"


def _record(signal_name: str):
    def receiver(sender, info: TaskInfo, **kwargs) -> None:
        from lanes.redis_client import get_redis

        event = {"signal": signal_name, "at": time.time(), "pid": os.getpid(), **dataclasses.asdict(info)}
        client = get_redis()
        client.rpush(events_key(info.type), json.dumps(event))
        client.expire(events_key(info.type), 3600)

    receiver.__name__ = f"record_{signal_name}"
    return receiver


_SIGNALS = {"queued": task_queued, "rejected": task_rejected, "started": task_started, "finished": task_finished}
_receivers = {name: _record(name) for name in _SIGNALS}


def connect() -> None:
    for name, signal in _SIGNALS.items():
        signal.connect(_receivers[name], dispatch_uid=f"test-recorder-{name}")


def disconnect() -> None:
    """For the test process, which imports this module to read events."""
    for name, signal in _SIGNALS.items():
        signal.disconnect(dispatch_uid=f"test-recorder-{name}")


connect()


def read_events(client, type_name: str) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(events_key(type_name), 0, -1)]
