"""When a task sent for later is due: checks of ``countdown`` / ``eta`` at dispatch (pure).

A dispatch may say ``countdown=S`` (seconds from now) or ``eta=<aware datetime>``
(or, by name and over HTTP, an ISO 8601 text with its offset), as Celery's
``apply_async`` does; at most one of them. The task is then due at that time;
it must start before its deadline (dispatch time + ``timeout``) and no later
than ``max_delay_s`` from now. An ``eta`` now or in the past, or a countdown of
0, means "now": the task is dispatched as any other.
"""

from __future__ import annotations

import math
from datetime import datetime

from lanes.messages import stored_ms
from tasks.validation import Invalid, shown

REASON = "invalid_eta"


def due_at(*, countdown: object, eta: object, now_s: float, deadline_s: float, max_delay_s: float) -> float | None:
    """The epoch seconds the task is due at, or None for "now"; ``Invalid('invalid_eta')`` naming what is wrong."""
    if countdown is None and eta is None:
        return None
    if countdown is not None and eta is not None:
        raise Invalid(REASON, "give countdown or eta, not both")
    if countdown is not None:
        if isinstance(countdown, bool) or not isinstance(countdown, (int, float)):
            raise Invalid(REASON, f"countdown must be a number of seconds, not {shown(countdown)}")
        # The range test refuses nan and inf, and compares ints of any size exactly.
        if not 0 <= countdown <= max_delay_s:
            if isinstance(countdown, float) and math.isnan(countdown):
                raise Invalid(REASON, "countdown must be a number of seconds, not nan")
            raise Invalid(REASON, f"countdown must be seconds in [0, {max_delay_s:.0f}] (the longest delay), "
                                  f"not {shown(countdown)}")
        due = now_s + float(countdown)
        what = f"countdown {float(countdown):g}s"
    else:
        due = _eta_seconds(eta)
        if due - now_s > max_delay_s:
            raise Invalid(REASON, f"eta {shown(eta, 80)} is more than {max_delay_s:.0f}s (the longest delay) "
                                  "from now")
        what = f"eta {shown(eta, 80)}"
    if due <= now_s:
        return None
    # Compared as both are stored (``stored_ms``): a due time within the deadline's last millisecond would be
    # stored at the deadline itself, where the task expires as it becomes due. No deadline (inf): none to meet.
    if math.isfinite(deadline_s) and stored_ms(due) >= stored_ms(deadline_s):
        raise Invalid(REASON, f"{what} is at or after the task's deadline ({deadline_s - now_s:g}s from now): "
                              "it could never start; pass a longer timeout")
    return due


def _eta_seconds(eta: object) -> float:
    """Epoch seconds of an aware datetime or of an ISO 8601 text with an offset."""
    if isinstance(eta, str):
        if len(eta) > 64:
            raise Invalid(REASON, f"eta must be an ISO 8601 time with an offset, not {shown(eta)}")
        try:
            parsed = datetime.fromisoformat(eta)
        except ValueError:
            raise Invalid(REASON, f"eta must be an ISO 8601 time with an offset, not {shown(eta)}") from None
        eta = parsed
    if not isinstance(eta, datetime):
        raise Invalid(REASON, f"eta must be a timezone-aware datetime, not {shown(eta)}")
    if eta.tzinfo is None or eta.tzinfo.utcoffset(eta) is None:
        raise Invalid(REASON, f"eta {shown(eta, 80)} is naive: give it a timezone (e.g. UTC)")
    try:
        return eta.timestamp()
    except (OverflowError, ValueError, OSError) as exc:
        raise Invalid(REASON, f"eta {shown(eta, 80)} is out of range: {exc}") from None
