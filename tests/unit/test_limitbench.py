"""``tools.limitbench``'s figures from a sink record (pure)."""

from __future__ import annotations

from tools.limitbench import shares, steady_rate


def test_steady_rate_leaves_the_burst_out():
    burst = [0.0] * 10
    steady = [1.0 + i / 50 for i in range(101)]  # 50/s for 2 s after a burst of 10 at t=0
    assert steady_rate(burst + steady, burst=10) == 50.0
    assert steady_rate([1.0], burst=0) is None


def test_shares_count_only_while_every_key_has_a_backlog():
    order = ["big", "big", "big", "small", "plain"] * 10 + ["big"] * 50
    got = shares(order, {"big": 3, "small": 1}, {"big": 100, "small": 10, "plain": 10})
    assert got["big"] == {"completions": 30, "share": 0.6122, "expected": 0.6}
    assert got["small"]["completions"] == 10 and got["plain"]["completions"] == 9  # small ran out first
