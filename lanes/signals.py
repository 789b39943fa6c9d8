"""Signals the engine sends; the apps built on it connect their receivers in ``ready()``.

``lanes`` never imports the apps above it. When the transport drops a message it
cannot decode, it says so through ``message_unreadable``; the tasks app keeps
such a message as a ``malformed`` dead letter (``tasks.receivers``).
"""

from __future__ import annotations

from django.dispatch import Signal

#: Sent by ``lanes.transport`` with ``task_id`` (made up: the message has none that
#: can be read), ``message`` (what was wrong) and ``exc`` when it drops a message.
message_unreadable = Signal()
