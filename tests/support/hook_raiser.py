"""Test-only receivers that always raise: a broken receiver must not break a task.

Listed before the recorder in ``DISPATCH_HOOK_MODULES``, so they run first and
the recorder shows that the later receivers still ran.
"""

from __future__ import annotations

from tasks.signals import task_finished, task_queued, task_rejected, task_started

_SIGNALS = {"queued": task_queued, "rejected": task_rejected, "started": task_started, "finished": task_finished}


def explode(sender, info, **kwargs) -> None:
    raise RuntimeError(f"receiver failure on purpose ({info.type})")


def connect() -> None:
    for name, signal in _SIGNALS.items():
        signal.connect(explode, dispatch_uid=f"test-raiser-{name}")


def disconnect() -> None:
    for name, signal in _SIGNALS.items():
        signal.disconnect(dispatch_uid=f"test-raiser-{name}")


connect()
