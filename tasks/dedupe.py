"""Throttle and debounce beside idempotency: a task type's ``dedupe`` mode and window (pure).

``key`` (the default) is idempotency as it always was: a key seen before answers
its task (same payload) or ``idempotency_conflict``. ``throttle``: the first
dispatch of a key runs; any other within the window after it is answered
``duplicate`` with the first's id, whatever its payload. ``debounce``: each
dispatch is sent for later by the window and replaces the one of its key still
waiting (REVOKED, "replaced by <new id>"), so only the last of a burst runs.

The decision itself is one step of ``lanes/lua/_admit.lua``; this module holds
what Python checks and derives before it (``tests/support/dedupe_reference.py``
models the decisions for the property test).
"""

from __future__ import annotations

from typing import Any

MODES = ("key", "throttle", "debounce")
#: Longest window, in seconds (a day: the default idempotency window).
MAX_WINDOW_S = 86400.0


def window_problem(mode: Any, window_s: Any, timeout_s: Any = None) -> tuple[str, str] | None:
    """``(field, message)`` naming what is wrong with a type's mode and window, or None.

    A throttle or debounce needs a window above 0; a debounce's is its task's
    countdown, so it must leave time before the task's deadline (its timeout).
    """
    if mode not in MODES:
        return "dedupe", f"Dedupe mode must be one of {', '.join(MODES)}, not {str(mode)[:40]!r}."
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not 0 <= window_s <= MAX_WINDOW_S:
        return "dedupe_window", f"Dedupe window must be seconds between 0 and {MAX_WINDOW_S:.0f}."
    if mode != "key" and window_s <= 0:
        return "dedupe_window", f"A {mode} needs a dedupe window above 0 seconds."
    if (mode == "debounce" and isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
            and window_s >= timeout_s):
        return "dedupe_window", (f"A debounce's window ({window_s:g} s) delays each task by that much: it must be "
                                 f"below the timeout ({timeout_s:g} s), the task's whole life.")
    return None


def dedupe_key_of(mode: str, idempotency_key: str, dedupe_key: str) -> str:
    """The key a throttle or debounce goes by ('' none: admitted as plain): ``dedupe_key``, else the
    idempotency key. A ``key`` type has none (its idempotency key works as it always did)."""
    if mode == "key":
        return ""
    return dedupe_key or idempotency_key


def keeps_idempotency(mode: str, idempotency_key: str, dedupe_key: str) -> bool:
    """Whether the idempotency key is also checked as such: always for ``key``; for a throttle or
    debounce only when a separate ``dedupe_key`` carries the dedupe (else the key *is* the dedupe key:
    its window, not the idempotency window, says when it is free again)."""
    return bool(idempotency_key) and (mode == "key" or bool(dedupe_key))


def replaced_detail(new_task_id: str) -> str:
    """The REVOKED reason of a debounced task a later one replaced."""
    return f"replaced by {new_task_id}"
