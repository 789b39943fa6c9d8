"""The lifecycle signals: ``task_queued``, ``task_rejected``, ``task_started``, ``task_finished``.

Each is sent with ``info=TaskInfo(...)``. Receivers run in the process where the
event happens (the caller for queued/rejected, the worker for started/finished);
they are called with ``send_robust``, so a receiver that raises is logged and
never breaks dispatch or execution. Connect like any Django signal::

    from tasks.signals import task_finished

    @receiver(task_finished)
    def on_finished(sender, info, **kwargs):
        if info.outcome == "dead": alert(info.task_id, info.reason)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.dispatch import Signal

logger = logging.getLogger(__name__)

task_queued = Signal()
task_rejected = Signal()
task_started = Signal()
task_finished = Signal()


@dataclass(frozen=True)
class TaskInfo:
    task_id: str | None
    type: str
    lane: str
    chat_id: str = ""
    attempt: int = 0
    #: Seconds from dispatch to the start of this attempt (started/finished).
    queue_latency_s: float | None = None
    #: Seconds the handler ran (finished).
    execution_latency_s: float | None = None
    #: ``succeeded`` | ``retrying`` | ``dead`` | ``cancelled`` (finished).
    outcome: str = ""
    #: Rejection or dead-letter reason.
    reason: str = ""
    detail: str = ""


def _listened(signal: Signal) -> bool:
    """Whether ``signal`` has a live receiver. Its list is looked at first: ``has_listeners`` walks it
    under a lock, about 12 µs, and this runs for every dispatch (a fifth of ``dispatch_many``'s CPU an
    item, with nobody listening)."""
    return bool(signal.receivers) and signal.has_listeners(TaskInfo)


def _send(signal: Signal, info: TaskInfo) -> None:
    """Send ``info``; the callers asked ``_listened`` first, to build no info for nobody."""
    for receiver, response in signal.send_robust(sender=TaskInfo, info=info):
        if isinstance(response, Exception):
            logger.error("hook_receiver_failed receiver=%r error=%r", receiver, response)


def emit_queued(task_id: str, type_name: str, lane: str, chat_id: str) -> None:
    if _listened(task_queued):
        _send(task_queued, TaskInfo(task_id, type_name, lane, chat_id))


def emit_rejected(type_name: str, lane: str, reason: str, detail: str) -> None:
    if _listened(task_rejected):
        _send(task_rejected, TaskInfo(None, type_name, lane, reason=reason, detail=detail))


def emit(signal: Signal, make_info: Callable[[], TaskInfo]) -> None:
    """Send ``signal`` with the info ``make_info`` builds, only if anyone listens."""
    if _listened(signal):
        _send(signal, make_info())
