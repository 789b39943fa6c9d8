"""Finding a live task's record from its task id alone (a cancel or a search by id).

A task without a chat has its record at ``keys.task_record(task_id)``: one
``EXISTS``. A chat-scoped task's record carries its chat's hash tag, so its key
cannot be computed from the id; admission writes nothing extra to find it (the
dispatch hot path pays nothing for a cancel it may never see). Instead the two
sets that hold every live record are scanned for a key ending in the id:

- ``keys.DEADLINES``: every waiting record (queued, behind its chat's head,
  scheduled, parked for a retry, waiting on a limit);
- ``keys.LEASES``: every claimed record (running, finished or cancelled and not
  yet settled).

Scanned in that order, a record a worker claims during the scan (it moves from
the first to the second) is still found. The cost is O(live tasks), a
``ZSCAN`` page of ``SCAN_COUNT`` per round trip: fine for an operator's cancel,
not for a hot path. A caller that knows the chat (``DispatchResult.cancel``,
``cancel_task(..., chat_id=...)``) pays one ``EXISTS`` instead.
"""

from __future__ import annotations

from typing import Any

from lanes import keys

#: Members a ZSCAN page looks at per round trip.
SCAN_COUNT = 1000
_GLOB_SPECIAL = frozenset("*?[]\\")


def glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + c if c in _GLOB_SPECIAL else c for c in text)


def chat_record_pattern(task_id: str) -> str:
    """A MATCH pattern of every chat-scoped record key of ``task_id`` (any chat)."""
    return f"{glob_escape(keys.CHAT_PREFIX)}*:t:{glob_escape(task_id)}"


def locate(client: Any, task_id: str, chat_id: str | None = None) -> str | None:
    """The key of ``task_id``'s record if Redis still holds it, else None.

    ``chat_id``, when the caller knows it, is tried first (one ``EXISTS``); a
    wrong one costs the scan, never a wrong answer. ``task_id`` must be a valid
    id (no ':'): the scan matches record keys by their last segment.
    """
    guess = keys.task_record(task_id, chat_id or None)
    if client.exists(guess):
        return guess
    if chat_id:
        plain = keys.task_record(task_id)
        if client.exists(plain):
            return plain
    return scan_for_chat_record(client, task_id)


def scan_for_chat_record(client: Any, task_id: str) -> str | None:
    """The chat-scoped record of ``task_id`` found in the deadlines set, then the leases set (module docstring)."""
    pattern = chat_record_pattern(task_id)
    suffix = ":t:" + task_id
    for key in (keys.DEADLINES, keys.LEASES):
        for member, _score in client.zscan_iter(key, match=pattern, count=SCAN_COUNT):
            record = member.decode() if isinstance(member, bytes) else str(member)
            if record.startswith(keys.CHAT_PREFIX) and record.endswith(suffix):
                return record
    return None

