"""Pure decisions of lanes.consumers: which lanes a catch-all worker adopts or gives back."""

from __future__ import annotations

from lanes.consumers import no_consumer_detail, state, to_release, unclaimed


def test_unclaimed_lanes_are_those_nobody_holds():
    holders = {"a": ["w1@h"], "b": [], "c": ["me@h"]}
    assert unclaimed(["a", "b", "c", "d"], holders, mine=["c"]) == ["b", "d"]
    assert unclaimed(["b"], holders, mine=["b"]) == []


def test_adopted_lanes_are_given_back_to_dedicated_workers_only():
    holders = {"a": ["me@h", "ded@h"], "b": ["me@h", "other-catch-all@h"], "c": ["me@h"]}
    assert to_release(["a", "b", "c", "gone"], ["a", "b", "c"], holders,
                      catch_all_workers=["me@h", "other-catch-all@h"], me="me@h") == ["a", "gone"]


def test_state_says_no_worker_before_paused():
    assert state(0, paused=True) == "no worker"
    assert state(2, paused=True) == "paused"
    assert state(1, paused=False) == "consuming"
    assert "'x'" in no_consumer_detail("x")
