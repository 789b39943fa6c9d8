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


def test_a_task_waiting_on_a_rate_limit_waits_for_those_ahead_at_the_rate():
    from tasks.estimate import limit_wait

    chat_rate = limit_wait("telegram-chat", 5, {"scope": "chat", "rate": 1, "burst": 3})
    assert est(limit=chat_rate) == (6.0, "")  # five ahead and its own token, at 1/s
    bot = limit_wait("telegram", 59, {"scope": "global", "rate": 30, "burst": 30})
    assert est(limit=bot) == (2.0, "")
    # The lane's wait still counts when it is the longer one (3 s of work ahead on a 10/s lane: 0.1 s handlers).
    assert est(limit=limit_wait("x", 0, {"rate": 100}), ahead_in_lane=30) == (3.0, "")


def test_a_task_waiting_on_a_cap_waits_handler_times_and_a_pause_first():
    from tasks.estimate import limit_wait

    capped = limit_wait("supplier", 11, {"scope": "key", "max_in_flight": 6}, paused_for_s=1.5)
    assert est(limit=capped) == (1.5 + 12 / 6 * 0.1, "")
    both = limit_wait("s", 9, {"scope": "key", "rate": 2, "max_in_flight": 1})
    assert est(limit=both) == (5.0, "")  # 10 turns: 5 s at 2/s, 1 s of handlers
    value, why = est(limit=capped, completed=0, busy_s=0.0)
    assert value is None and "limit 'supplier'" in why
    assert limit_wait("gone", 3, None) is None
