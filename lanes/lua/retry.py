"""``retry.lua``'s wrapper: park a failed attempt's successor in its lane's delayed set."""

from __future__ import annotations

from typing import NamedTuple

from lanes import keys
from lanes.lua.loader import call

NAME = "retry"


class Retried(NamedTuple):
    """retry.lua's answer. ``status``: 'ok' (parked), 'already' (``detail``: the state it was in:
    parked by an earlier run of this call, or another attempt's now) or 'cancelled' (``detail``: the
    cancel's detail: not retried; the worker ends it cancelled)."""

    status: str
    detail: str = ""


def retry(
    *, record: str, lane: str, now: float, next_attempt: int, message: str, due: float, queued_lease_ms: int,
    metric_field: str, owner: str, retry_after_s: float | None = None,
) -> Retried:
    """Run retry.lua (KEYS/ARGV in its header); ``due`` is epoch seconds.

    ``retry_after_s``: the provider's Retry-After, which pauses the task's global and key limits.
    """
    reply = call(
        NAME,
        [record, keys.LEASES, keys.lane_delayed(lane), keys.METRICS_TOTAL, keys.metrics_minute(int(now // 60)),
         keys.DEADLINES],
        [next_attempt, message, int(due * 1000), queued_lease_ms, metric_field, owner, int(now * 1000),
         max(0, int((retry_after_s or 0) * 1000)), keys.LIMIT_PREFIX, keys.LANE_PREFIX],
    )
    return Retried(*(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in reply))
