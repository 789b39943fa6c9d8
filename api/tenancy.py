"""Every API caller in its own room: who owns a task, and the caller's names kept apart (pure).

A task made through the API carries its token in its id (``tk<token id>-<uuid>``,
``tasks.owners``): the API mints every id, so a caller cannot choose one in
another's room, and reading or cancelling a task needs no lookup of who made it.

A caller's chat ids, idempotency, dedupe and limit keys are prefixed with its
namespace (``tk<token id>:``) before admission, so two tokens' ``"c1"`` are two
chats and one token cannot take, fill or park another's. A task type marked
*shared* keeps them as given: every caller's ``"c1"`` is then one chat.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tasks.owners import owns, task_id_prefix  # noqa: F401  (the API's names for them)
from tasks.schedule import due_at
from tasks.validation import (
    MAX_CHAT_ID_LEN,
    MAX_IDEMPOTENCY_KEY_LEN,
    MAX_LIMIT_KEY_LEN,
    Invalid,
    is_clean_text,
)

_CONFLICT_RE = re.compile(r"used by task (\S+) with")

#: The options namespaced per caller, the longest each may be after its prefix, and their rejection reason.
NAMESPACED: dict[str, tuple[int, str]] = {
    "chat_id": (MAX_CHAT_ID_LEN, "invalid_chat_id"),
    "idempotency_key": (MAX_IDEMPOTENCY_KEY_LEN, "invalid_idempotency_key"),
    "dedupe_key": (MAX_IDEMPOTENCY_KEY_LEN, "invalid_dedupe_key"),
    "limit_key": (MAX_LIMIT_KEY_LEN, "invalid_limit_key"),
}


def namespace(token_id: int) -> str:
    return f"tk{token_id}:"


@dataclass(frozen=True)
class Room:
    """One token's view of one task type: its namespace (unless the type is shared) and its ceilings."""

    token_id: int
    shared: bool
    #: The type's timeout: the longest whole life a caller may ask.
    max_timeout_s: float
    #: The longest countdown / eta a caller may ask (the type's ``max_delay``, else its timeout).
    max_delay_s: float

    @property
    def prefix(self) -> str:
        return "" if self.shared else namespace(self.token_id)

    def scoped(self, options: dict[str, Any], *, now_s: float) -> dict[str, Any]:
        """``options`` with the caller's names namespaced; ``Invalid`` for a ceiling passed or a name too long.

        A value that is not clean text is passed on unchanged: admission refuses it
        with its own reason, so nothing unchecked reaches a namespace.
        """
        timeout = options.get("timeout")
        if _number(timeout) and timeout > self.max_timeout_s:
            raise Invalid("invalid_timeout", f"timeout {float(timeout):g}s is above this task type's timeout "
                                             f"({self.max_timeout_s:g}s), the longest a caller may ask")
        if options.get("countdown") is not None or options.get("eta") is not None:
            due_at(countdown=options.get("countdown"), eta=options.get("eta"), now_s=now_s, deadline_s=math.inf,
                   max_delay_s=self.max_delay_s)
        if self.shared:
            return options
        out = dict(options)
        for name, (longest, reason) in NAMESPACED.items():
            value = out.get(name)
            if not isinstance(value, str):
                continue
            room = longest - len(self.prefix)
            if is_clean_text(value, room):
                out[name] = self.prefix + value
            elif is_clean_text(value, longest):
                raise Invalid(reason, f"{name} must be 1..{room} printable characters")
        return out

    def shown(self, detail: str, options: dict[str, Any]) -> str:
        """A rejection's detail as this caller should read it: its own names, and no other caller's task."""
        if not self.shared:
            for name in NAMESPACED:
                value = options.get(name)
                if isinstance(value, str) and is_clean_text(value, NAMESPACED[name][0]):
                    detail = detail.replace(repr(self.prefix + value), repr(value))
        found = _CONFLICT_RE.search(detail)
        if found and not owns(self.token_id, found.group(1)):
            detail = detail.replace(f"used by task {found.group(1)} with", "used by another caller's task with")
        return detail


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
