"""The load test's throughput verdict: a step holds its rate only if completions keep up during the step."""

from __future__ import annotations

from tools.loadcheck import (
    Applied,
    StepLoad,
    completed_between,
    depth_grows,
    depth_slope,
    knee,
    sustained,
    throughput_problems,
)


def load(completed: float, offered: float = 100.0, backlog: int = 0, drain_s: float | None = 0.5,
         drained: bool = True, target: float = 100.0) -> StepLoad:
    return StepLoad(target, offered, completed, backlog, drained, drain_s, 10.0)


def test_a_step_completing_63_percent_of_offered_fails_even_if_it_drains_in_time():
    problems = throughput_problems(load(63.0, backlog=370, drain_s=6.0))
    assert any("63%" in p and "63/s" in p and "100/s" in p for p in problems), problems
    assert any("backlog at the step's end 370 >= 100" in p for p in problems), problems


def test_98_percent_with_a_small_backlog_passes():
    assert throughput_problems(load(98.0, backlog=12)) == []


def test_the_end_backlog_must_be_under_one_second_of_offered_load():
    assert throughput_problems(load(99.0, backlog=99)) == []
    assert throughput_problems(load(99.0, backlog=100)) == ["backlog at the step's end 100 >= 100 (1s of offered load)"]


def test_drain_rules_still_hold():
    assert throughput_problems(load(99.0, drain_s=12.0)) == ["drained in 12.0s > 10s"]
    assert throughput_problems(load(99.0, drained=False, drain_s=None)) == ["did not drain"]


def test_a_generator_that_falls_behind_does_not_pass_the_target_rate():
    problems = throughput_problems(load(300.0, offered=300.0, target=400.0))
    assert problems and "generator offered 300/s" in problems[0]


def test_completed_between_counts_first_applications_inside_the_window():
    log = [Applied("a", 1, 1000, "k1"), Applied("a", 2, 1500, "k2"), Applied("a", 2, 1600, "k2"),
           Applied("b", 1, 2500, "k3"), Applied("z", 1, 1200, "other")]
    assert completed_between(log, {"k1", "k2", "k3"}, 1000, 2000) == 2


def _ramp(slope: float, seconds: float = 10, base: float = 20, wobble: float = 5) -> list[tuple[float, float]]:
    return [(t / 4, base + slope * t / 4 + (wobble if t % 2 else -wobble)) for t in range(int(seconds * 4))]


def test_depth_slope_and_growth_on_synthetic_samples():
    assert abs(depth_slope(_ramp(50.0)) - 50.0) < 1.0
    assert depth_slope([(0, 5)]) == 0.0
    assert not depth_grows(200, _ramp(0.0))  # flat, noisy: steady state
    assert not depth_grows(200, _ramp(3.0))  # under 2 % of the rate
    assert depth_grows(200, _ramp(40.0))


def test_knee_is_the_lowest_rate_where_depth_starts_to_grow():
    steps = [(400, _ramp(120.0)), (100, _ramp(0.0)), (300, _ramp(30.0)), (200, _ramp(1.0))]
    assert knee(steps) == 300
    assert knee([(100, _ramp(0.0)), (200, _ramp(0.5))]) is None


def test_sustained_is_the_highest_passing_step():
    assert sustained([(100, True), (200, True), (300, False), (400, False)]) == 200
    assert sustained([(100, False)]) is None
