"""The arithmetic of lanes.capacity on its measured constants."""

from __future__ import annotations

import pytest

from lanes import capacity


def test_a_load_needs_its_rate_times_the_cpu_per_task_and_its_backlog_times_the_bytes():
    cost = capacity.PATHS["plain"]
    plan = capacity.plan(rate=1000, backlog=100_000, path="plain", high=0.9)
    assert plan.cores == pytest.approx(1000 * cost.redis_cpu_us / 1e6 / capacity.CORE_TARGET)
    assert plan.deployments == max(1, -(-plan.cores // 1))
    assert plan.memory_bytes == int(capacity.BASELINE_BYTES + 100_000 * cost.bytes_waiting)
    assert plan.maxmemory_bytes == int(plan.memory_bytes / 0.9)
    assert capacity.plan(rate=0, backlog=0).deployments == 1


def test_per_core_and_per_gib_figures_invert_the_costs():
    for path, cost in capacity.PATHS.items():
        assert capacity.tasks_per_core(path, target=1.0) == pytest.approx(1e6 / cost.redis_cpu_us)
        per_gib = capacity.backlog_per_gib(path)
        assert per_gib * cost.bytes_waiting <= capacity.GIB - capacity.BASELINE_BYTES
        assert (per_gib + 1) * cost.bytes_waiting > capacity.GIB - capacity.BASELINE_BYTES


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"rate": -1, "backlog": 0}, "rate"), ({"rate": float("nan"), "backlog": 0}, "rate"),
    ({"rate": 1, "backlog": -5}, "backlog"), ({"rate": 1, "backlog": 1, "path": "turbo"}, "turbo"),
    ({"rate": 1, "backlog": 1, "high": 0}, "share"), ({"rate": 1, "backlog": 1, "high": 1.5}, "share"),
])
def test_bad_input_is_a_clear_error_naming_it(kwargs, named):
    with pytest.raises(ValueError, match=named):
        capacity.plan(**kwargs)


def test_the_memory_limit_and_room():
    assert capacity.memory_limit(0) is None
    assert capacity.memory_limit(1000, 0.9) == 900
    assert capacity.room_tasks(500, 900, 100.0) == 4
    assert capacity.room_tasks(950, 900, 100.0) == 0
    assert capacity.room_tasks(500, None, 100.0) is None
