"""Measurement only: a do-nothing receiver on each lifecycle signal (the cost of subscribing)."""

from __future__ import annotations

from tasks.signals import task_finished, task_queued, task_rejected, task_started

_SIGNALS = (task_queued, task_rejected, task_started, task_finished)


def noop(sender, info, **kwargs) -> None:
    return None


def connect() -> None:
    for i, signal in enumerate(_SIGNALS):
        signal.connect(noop, dispatch_uid=f"noop-receiver-{i}")


def disconnect() -> None:
    for i, signal in enumerate(_SIGNALS):
        signal.disconnect(dispatch_uid=f"noop-receiver-{i}")


connect()
