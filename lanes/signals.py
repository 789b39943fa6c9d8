"""Signals the engine sends; the apps built on it connect their receivers in ``ready()``.

``lanes`` never imports the apps above it. When the transport drops a message it
cannot decode, it says so through ``message_unreadable``; the tasks app keeps
such a message as a ``malformed`` dead letter (``tasks.receivers``).
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

#: Sent by ``lanes.transport`` with ``task_id`` (made up: the message has none that
#: can be read), ``message`` (what was wrong) and ``exc`` when it drops a message.
message_unreadable = Signal()

#: Names that lived here before issue 14 (the config-version bump), now in ``lanes.config_version``.
_MOVED = {"bump_config_version", "bump_db_revision", "bump_failures_reported_to", "ConfigVersionNotPublished",
          "BUMP_RETRY_DELAYS_S"}


def __getattr__(name: str) -> Any:
    """Keep ``from lanes.signals import bump_config_version`` working, without importing models here."""
    if name in _MOVED:
        from lanes import config_version  # inner import: the transport imports this module before apps are ready

        return getattr(config_version, name)
    raise AttributeError(f"module 'lanes.signals' has no attribute {name!r}")
