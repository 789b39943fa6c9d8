"""The admin's page of one task's history (``tasks.history.read``), in a reader's words and times.

Every value comes from Redis or the database and is escaped by the template;
times are shown in UTC with milliseconds.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from tasks import history_view as history
from tasks.cancel import valid_task_id

#: Longest result or error shown on the page (the rest is cut, with a note).
SHOWN_MAX = 2000


def when(seconds: Any) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS.mmm UTC`` ('' for none)."""
    if not isinstance(seconds, (int, float)) or not seconds:
        return ""
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _span(start: Any, end: Any) -> str:
    if isinstance(start, (int, float)) and isinstance(end, (int, float)) and start and end:
        return f"{max(0.0, end - start):.3f} s"
    return ""


def shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX] + f"… ({len(text)} characters)"


def page(task_id: str) -> dict[str, Any] | None:
    """The template's values for ``task_id``, or None when no task of that id is known."""
    if not valid_task_id(task_id):
        return None
    found = history.read(task_id)
    if found is None:
        return None
    dispatched = found.dispatched or {}
    options = [(name, shown(value)) for name, value in (dispatched.get("options") or {}).items()]
    if "eta" in (dispatched.get("options") or {}):
        options = [(n, when(dispatched["options"]["eta"]) if n == "eta" else v) for n, v in options]
    attempts = [{
        "number": a.number, "worker": a.worker, "started": when(a.started_at), "ended": when(a.ended_at),
        "ran": _span(a.started_at, a.ended_at), "waited": f"{a.waited_s:.3f} s" if a.waited_s is not None else "",
        "outcome": a.outcome, "error": shown(a.error) if a.error else "",
        "retry_in": f"{a.retry_delay_s:.3f} s" if a.retry_delay_s is not None else "",
    } for a in found.attempts]
    progress = found.progress
    waiting = found.waiting
    return {
        "task_id": task_id, "by": found.by, "state": found.state, "state_text": found.state_text,
        "dispatched": dispatched and {"at": when(dispatched.get("at")), "type": dispatched.get("type", ""),
                                      "lane": dispatched.get("lane", ""), "options": options},
        "waiting": waiting and {**waiting, "eta": when(waiting.get("eta"))},
        "attempts": attempts,
        "cancelled": found.cancelled and {"at": when(found.cancelled.get("at")),
                                          "detail": shown(found.cancelled.get("detail") or "")},
        "dead_letter": found.dead_letter and {**found.dead_letter, "at": when(found.dead_letter.get("at"))},
        "result": found.result and {**found.result, "at": when(found.result.get("at")),
                                    "value": shown(found.result.get("value"))},
        "progress": progress and {"percent": round(100 * float(progress.get("fraction") or 0)),
                                  "fraction": progress.get("fraction"), "note": progress.get("note") or "",
                                  "at": when(progress.get("at"))},
    }
