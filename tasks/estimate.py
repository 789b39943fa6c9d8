"""``DispatchResult.estimated_delay``: how long an accepted task should wait before it starts (pure).

The old estimate divided the lane's whole depth by its completions per second
over the last one or two minutes. On an almost idle lane that rate is the
*demand* (a few tasks a minute), not what the workers can do, so one task ahead
read as tens of seconds when the real wait was about zero; and a paused lane
read 0.0 although nothing would run.

Now the wait is the work really ahead of the task divided by what the lane's
workers can drain:

- ``ahead_in_lane``: messages in the lane's lists a worker takes first (same or
  more urgent priority), counted by the admission script;
- the drain rate is the larger of the measured completion rate and one worker
  slot's rate, ``completed / busy_s`` (handler seconds spent, from finish.lua):
  a lane that keeps up with its demand still has at least one slot that takes
  the next message as soon as its handler returns;
- a chat message also waits for each earlier message of its chat to run, one at
  a time: ``ahead_in_chat * mean handler time``.

No estimate (``None``, with the reason in ``detail``) when nothing would drain
the lane: it is paused, it has no live consumer (once heartbeats tell), or it
finished nothing recently while work is ahead.

A task a limit did not admit (it waits in Redis on one instance, ``LimitWait``)
waits for the ``ahead`` tasks waiting there before it and then for its own
turn: about ``(ahead + 1) / rate`` on a rate-limited instance, ``(ahead + 1) /
max_in_flight`` handler times on a capped one, after any Retry-After pause; the
larger of that and the lane's own wait. (Only the limit it waits on now is
counted: another of its limits may hold it again afterwards.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LimitWait:
    """The limit instance an accepted task waits on, from the admission reply and the config snapshot."""

    name: str
    ahead: int  # tasks waiting on the instance before this one
    rate: float | None = None  # tasks/s of one instance
    max_in_flight: int | None = None  # running at once on one instance (the window of a fair-share limit)
    paused_for_s: float = 0.0  # what is left of a Retry-After pause of the instance


def limit_wait(name: str, ahead: int, definition: Mapping[str, Any] | None, paused_for_s: float = 0.0
               ) -> LimitWait | None:
    """A ``LimitWait`` from a limit's definition (``tasks.config`` snapshot / ``dispatch:lim:def``); None if unknown."""
    if definition is None:
        return None
    cap = definition.get("window") if definition.get("fair_share") else definition.get("max_in_flight")
    return LimitWait(name=name, ahead=max(0, int(ahead)), rate=definition.get("rate") or None,
                     max_in_flight=int(cap) if cap else None, paused_for_s=max(0.0, paused_for_s))


def limit_delay(wait: LimitWait, mean_handler_s: float | None) -> float | None:
    """Seconds until the limit admits the task, or None when nothing tells (a cap with no handler time yet)."""
    turns = wait.ahead + 1
    seconds = 0.0
    if wait.rate:
        seconds = turns / wait.rate
    if wait.max_in_flight:
        if mean_handler_s is None:
            return None if not wait.rate else round(wait.paused_for_s + seconds, 3)
        seconds = max(seconds, turns / wait.max_in_flight * mean_handler_s)
    return round(wait.paused_for_s + seconds, 3)


def estimate_delay(
    *,
    lane: str,
    ahead_in_lane: int,
    ahead_in_chat: int,
    completed: int,
    busy_s: float,
    window_s: float,
    paused: bool = False,
    consumers: int | None = None,
    limit: LimitWait | None = None,
) -> tuple[float | None, str]:
    """Seconds the task should wait before a worker starts it, and why there is no estimate if there is none.

    ``completed`` and ``busy_s`` are the lane's completions and handler seconds
    over the last ``window_s`` seconds; ``consumers`` is the number of live
    workers consuming the lane, or ``None`` when unknown; ``limit`` the limit
    instance the task waits on (None: every limit admitted it, or it has none).
    """
    if paused:
        return None, f"lane '{lane}' is paused: no worker takes its tasks until it is resumed"
    if consumers == 0:
        return None, f"lane '{lane}' has no live consumer: no worker takes its tasks"
    mean_handler_s = max(0.0, busy_s) / completed if completed > 0 else None
    if limit is not None:
        waited = limit_delay(limit, mean_handler_s)
        if waited is None:
            return None, (f"the task waits on limit '{limit.name}' ({limit.ahead} ahead) and lane '{lane}' "
                          "finished no task recently: no handler time to estimate its turn from")
        lane_wait, _ = estimate_delay(lane=lane, ahead_in_lane=ahead_in_lane, ahead_in_chat=ahead_in_chat,
                                      completed=completed, busy_s=busy_s, window_s=window_s)
        return round(max(waited, lane_wait or 0.0), 3), ""
    if ahead_in_lane <= 0 and ahead_in_chat <= 0:
        return 0.0, ""
    if completed <= 0 or window_s <= 0 or mean_handler_s is None:
        return None, (f"lane '{lane}' finished no task in the last {window_s:.0f}s: "
                      "no drain rate to estimate the wait from")
    measured_per_s = completed / window_s
    one_slot_per_s = 1.0 / mean_handler_s if mean_handler_s > 0 else float("inf")
    drain_per_s = max(measured_per_s, one_slot_per_s)
    seconds = max(0, ahead_in_lane) / drain_per_s + max(0, ahead_in_chat) * mean_handler_s
    return round(seconds, 3), ""
