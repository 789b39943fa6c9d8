"""Alias of ``tasks.signals`` (the lifecycle signals), kept for receivers written before issue 14.

Modules listed in ``DISPATCH_HOOK_MODULES`` import the signals from here
(``from tasks.hooks import task_finished``); that keeps working. New code
imports ``tasks.signals``.
"""

from __future__ import annotations

from tasks.signals import TaskInfo, emit, task_finished, task_queued, task_rejected, task_started

__all__ = ["TaskInfo", "emit", "task_finished", "task_queued", "task_rejected", "task_started"]
