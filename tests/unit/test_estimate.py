"""``tasks.estimate.estimate_delay``: the pure estimate behind ``DispatchResult.estimated_delay``."""

from __future__ import annotations

from tasks.estimate import estimate_delay


def est(**kw):
    base = {"lane": "l", "ahead_in_lane": 0, "ahead_in_chat": 0, "completed": 10, "busy_s": 1.0, "window_s": 100.0}
    return estimate_delay(**{**base, **kw})


def test_nothing_ahead_waits_nothing():
    assert est() == (0.0, "")


def test_one_ahead_on_an_almost_idle_lane_is_one_handler_time_not_the_demand_rate():
    # 10 completions in 100 s (0.1/s demand) of 0.1 s handlers: one slot drains 10/s.
    assert est(ahead_in_lane=1) == (0.1, "")


def test_a_saturated_lane_uses_its_measured_rate():
    # 1000 done in 100 s = 10/s with 0.5 s handlers (5 slots busy): 20 ahead wait 2 s.
    assert est(ahead_in_lane=20, completed=1000, busy_s=500.0) == (2.0, "")


def test_a_chat_message_waits_for_each_earlier_message_of_its_chat():
    assert est(ahead_in_chat=3) == (0.3, "")


def test_no_estimate_with_a_reason_when_nothing_drains():
    assert est(paused=True)[0] is None and "paused" in est(paused=True)[1]
    assert est(consumers=0)[0] is None and "no live consumer" in est(consumers=0)[1]
    value, why = est(ahead_in_lane=2, completed=0, busy_s=0.0)
    assert value is None and "finished no task" in why
