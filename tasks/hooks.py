"""The lifecycle signals' former name, kept so users' receiver modules keep working; the name is ``tasks.signals``.

``from tasks.hooks import task_finished`` was documented for the modules listed
in ``DISPATCH_HOOK_MODULES``; it still gives the very same signal objects, and
importing it warns (``DeprecationWarning``) so a receiver can move to
``tasks.signals`` before the name goes.
"""

from __future__ import annotations

import warnings

from tasks.signals import TaskInfo, emit, task_finished, task_queued, task_rejected, task_started

warnings.warn("tasks.hooks is deprecated: import the lifecycle signals from tasks.signals",
              DeprecationWarning, stacklevel=2)

__all__ = ["TaskInfo", "emit", "task_finished", "task_queued", "task_rejected", "task_started"]
