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
"""

from __future__ import annotations


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
) -> tuple[float | None, str]:
    """Seconds the task should wait before a worker starts it, and why there is no estimate if there is none.

    ``completed`` and ``busy_s`` are the lane's completions and handler seconds
    over the last ``window_s`` seconds; ``consumers`` is the number of live
    workers consuming the lane, or ``None`` when unknown.
    """
    if paused:
        return None, f"lane '{lane}' is paused: no worker takes its tasks until it is resumed"
    if consumers == 0:
        return None, f"lane '{lane}' has no live consumer: no worker takes its tasks"
    if ahead_in_lane <= 0 and ahead_in_chat <= 0:
        return 0.0, ""
    if completed <= 0 or window_s <= 0:
        return None, (f"lane '{lane}' finished no task in the last {window_s:.0f}s: "
                      "no drain rate to estimate the wait from")
    mean_handler_s = max(0.0, busy_s) / completed
    measured_per_s = completed / window_s
    one_slot_per_s = 1.0 / mean_handler_s if mean_handler_s > 0 else float("inf")
    drain_per_s = max(measured_per_s, one_slot_per_s)
    seconds = max(0, ahead_in_lane) / drain_per_s + max(0, ahead_in_chat) * mean_handler_s
    return round(seconds, 3), ""
