"""The load-test sink's record is bounded, and production installs get no sink type (issue 12, item 11)."""

from __future__ import annotations

import json

from tests.support.helpers import unique


def test_the_sink_record_keeps_at_most_its_cap(rc):
    from tools.sink import applied_key, log_key, record_applied

    run = unique("cap")
    for i in range(10):
        record_applied(run, f"k{i % 6}", f"line {i}", ttl_s=60, max_entries=3)
    assert rc.llen(log_key(run)) == 3
    assert rc.lrange(log_key(run), 0, -1) == [b"line 7", b"line 8", b"line 9"]
    applied = rc.hgetall(applied_key(run))
    assert len(applied) == 4  # three keys and the overflow count
    assert applied[b"k0"] == b"2" and int(applied[b"_overflow"]) == 4  # k3, k4, k5, k3
    assert 0 < rc.ttl(log_key(run)) <= 60


def test_the_batched_sink_record_is_the_same_record_with_its_calls_counted(rc):
    from tools.sink import applied_key, calls_key, log_key, record_applied_many

    run = unique("capb")
    record_applied_many(run, [(f"k{i % 6}", f"line {i}") for i in range(5)], ttl_s=60, max_entries=3)
    record_applied_many(run, [(f"k{i % 6}", f"line {i}") for i in range(5, 10)], ttl_s=60, max_entries=3)
    record_applied_many(run, [], ttl_s=60, max_entries=3)  # a call whose items all failed
    assert rc.lrange(log_key(run), 0, -1) == [b"line 7", b"line 8", b"line 9"]
    applied = rc.hgetall(applied_key(run))
    assert len(applied) == 4 and applied[b"k0"] == b"2" and int(applied[b"_overflow"]) == 4
    assert rc.get(calls_key(run)) == b"3" and 0 < rc.ttl(calls_key(run)) <= 60


def test_the_production_default_config_has_no_sink_type():
    from tasks.config_io import default_config_for
    from tasks.management.commands.bootstrap import DEFAULT_CONFIG

    data = json.loads(DEFAULT_CONFIG.read_text())
    assert any(t["handler"] == "loadtest.sink" for t in default_config_for(data, "")["task_types"])
    production = default_config_for(data, "production")
    assert production["task_types"] and not any(t["handler"] == "loadtest.sink" for t in production["task_types"])
    batched = {**data, "task_types": [*data["task_types"], {"name": "b", "handler": "loadtest.sink_batch"}]}
    kept = default_config_for(batched, "production")["task_types"]
    assert not any(t["handler"].startswith("loadtest.") for t in kept)
    assert production["lanes"] == data["lanes"]


def test_the_load_tests_sink_costs_what_it_subtracts(rc):
    """``manage.py loadtest`` subtracts the sink's own Redis commands from the platform's per task
    (``SINK_COMMANDS_PER_TASK``, and per item and call for the batched sink): counted here by Redis."""
    from tools.loadtest import BATCH_SINK_COMMANDS_PER_CALL, BATCH_SINK_COMMANDS_PER_ITEM, SINK_COMMANDS_PER_TASK
    from tools.sink import record_applied, record_applied_many

    def commands(action) -> int:
        # The fewest of three: this process's other threads (the counters' flush, once a second) may
        # run a command meanwhile, and only ever add to the count.
        counts = []
        for _ in range(3):
            before = sum(int(s["calls"]) for s in rc.info("commandstats").values())
            action()
            counts.append(sum(int(s["calls"]) for s in rc.info("commandstats").values()) - before - 1)  # the INFO
        return min(counts)

    run = unique("sinkcost")
    record_applied(run, "warm", "warm")  # the script is loaded
    record_applied_many(run, [("warm-b", "warm")])
    keys = iter(range(1000))
    assert commands(lambda: record_applied(run, f"k{next(keys)}", "line")) == SINK_COMMANDS_PER_TASK
    assert commands(lambda: record_applied_many(run, [(f"b{next(keys)}", "line") for _ in range(5)])) == \
        BATCH_SINK_COMMANDS_PER_ITEM * 5 + BATCH_SINK_COMMANDS_PER_CALL
