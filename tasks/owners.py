"""Who made a task, read from its id (pure).

The HTTP API mints its callers' task ids as ``tk<token id>-<uuid>`` and
``manage.py dispatch`` as ``cli-<uuid>``; any other id was made by Python code
(``dispatch.delay``, the by-name ``tasks.dispatch``). Because the platform
mints every id, a caller cannot pick one that marks another caller, and
knowing a task's owner costs no lookup. A requeued dead letter keeps its mark.
"""

from __future__ import annotations

import re

CLI_PREFIX = "cli-"
_MARK_RE = re.compile(r"^(tk\d+-|cli-)")


def task_id_prefix(token_id: int) -> str:
    return f"tk{token_id}-"


def mark_of(task_id: str) -> str:
    """The owner's mark that starts ``task_id`` ('' for Python code's ids)."""
    found = _MARK_RE.match(task_id)
    return found.group(1) if found else ""


def owner_of(task_id: str) -> str:
    """``token:<id>``, ``cli`` or ``python``: who made the task of this id."""
    mark = mark_of(task_id)
    if mark.startswith("tk"):
        return f"token:{mark[2:-1]}"
    return "cli" if mark == CLI_PREFIX else "python"


def owns(token_id: int, task_id: str) -> bool:
    return task_id.startswith(task_id_prefix(token_id))


#: A token's share of a lane when none is set: the whole capacity (the lane's own bound, ``lane_full``).
WHOLE_LANE_PCT = 100


def lane_quota(capacity: int, share_pct: int) -> int:
    """The most tasks a caller with ``share_pct`` % of a lane may hold waiting in it (0: no share applies).

    Rounded down, but at least one, so a small share of a small lane still admits a task; a share of
    100 % or more is the lane's capacity itself, which admission already bounds. A share below 1 % (a
    row written around the model's validation) is the smallest share, not none.
    """
    if share_pct >= WHOLE_LANE_PCT:
        return 0
    return max(1, capacity * max(1, share_pct) // WHOLE_LANE_PCT)
