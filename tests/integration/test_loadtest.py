"""``manage.py loadtest`` against real workers: a clean run passes, a broken sink is caught."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from tests.support.helpers import define, unique

LANE = "t-load"


def _loadtest(*args: str) -> tuple[int, dict]:
    out = io.StringIO()
    code = 0
    try:
        call_command("loadtest", *args, "--json", stdout=out, stderr=io.StringIO())
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, json.loads(out.getvalue())


@pytest.fixture(scope="module")
def load_worker(tmp_root):
    from tests.support.workers import Worker

    worker = Worker(LANE, tmp_root / "logs", pool="threads", concurrency=8).start()
    yield worker
    worker.retire()


def _sink_type() -> str:
    name = unique("lt")
    define(name, handler="loadtest.sink", lane=LANE, chat_scoped=True, chat_queue_size=1000,
           policy={"max_retries": 8, "initial_backoff": 0.05, "max_backoff": 0.2})
    return name


def test_small_stepped_load_is_verified_clean(load_worker, tmp_path):
    name = _sink_type()
    plot = tmp_path / "steps.png"
    code, report = _loadtest("--type", name, "--steps", "20,40", "--step-seconds", "3", "--chats", "30",
                             "--latency-ms", "5", "--fail-rate", "0.05", "--plot", str(plot), "--keep-going")
    assert code in (0, 1), report  # 1: a step not sustained (the machine's load); 3 would be incorrect
    assert [s["rate"] for s in report["steps"]] == [20, 40]
    for step in report["steps"]:
        _clean(step)
        assert step["e2e_ms"]["p99"] is not None and step["dispatch_ms"]["p50"] is not None
        # Enqueue->start, from the sink's first attempts: after the dispatch call began, p50 <= p99.
        assert 0 <= step["start_ms"]["p50"] <= step["start_ms"]["p99"], step["start_ms"]
        # Costs are measured, not assumed. Admission is one Lua call per turn of the caller's Joiner
        # (tasks.bulk): concurrent dispatches of the load generator's threads may share one, so a
        # dispatch costs a round trip or a share of one, never nothing.
        assert step["redis_commands_per_task"] > 0 and step["evalsha_per_task"] > 0
        assert 0 < step["dispatch_round_trips_per_task"] <= 1.5
    assert report["sustained_rate"] in (None, 20, 40)
    assert plot.exists() and plot.stat().st_size > 1000


def test_broken_sink_is_reported_lost_and_fails(load_worker):
    name = _sink_type()
    code, report = _loadtest("--type", name, "--steps", "40,80", "--step-seconds", "3", "--chats", "30",
                             "--latency-ms", "1", "--fail-rate", "0", "--drop-every", "50", "--drain-limit", "5")
    assert code == 3
    (step,) = report["steps"]  # the run stops at the first failing step
    assert step["lost"] >= 2 and not step["passed"] and "lost" in step["why"]
    assert step["duplicates"] == 0 and step["order_violations"] == 0
    assert report["sustained_rate"] is None


# -- issue 16: a batched type, dispatch_many, limit keys --------------------------------------------------


def _clean(step: dict) -> None:
    """Correct, whatever the speed: whether a step sustained its rate is the machine's load, not asserted."""
    assert (step["lost"], step["duplicates"], step["order_violations"], step["unknown"]) == (0, 0, 0, 0), step
    assert step["accepted"] == step["sent"] == step["applied"] + step["dead"] > 0, step
    assert step["pending"] == 0, step


BATCH_LANE = "t-load-batch"


@pytest.fixture(scope="module")
def batch_worker(tmp_root):
    """Two threads: fewer leaders than ready tasks, so each call gathers what arrived while it ran."""
    from tests.support.workers import Worker

    worker = Worker(BATCH_LANE, tmp_root / "logs", pool="threads", concurrency=2).start()
    yield worker
    worker.retire()


def test_a_batched_run_is_verified_clean_in_far_fewer_handler_calls(batch_worker):
    from lanes.models import Lane
    from tasks.models import TaskType

    Lane.objects.update_or_create(name=BATCH_LANE, defaults={"capacity": 100000, "accepting": True})
    name = unique("ltb")  # created by --batched on the test lane
    code, report = _loadtest("--type", name, "--batched", "--lane", BATCH_LANE, "--batch-size", "50",
                             "--batch-window-ms", "50", "--steps", "150", "--step-seconds", "3", "--chats", "200",
                             "--latency-ms", "40", "--fail-rate", "0.05")
    assert code in (0, 1), report
    tt = TaskType.objects.get(name=name)
    assert (tt.handler, tt.chat_scoped, tt.batch_size, tt.batch_window_ms) == ("loadtest.sink_batch", True, 50, 50)
    (step,) = report["steps"]
    _clean(step)
    # Counted by the sink, one per call: a batch is many tasks per call.
    assert step["handler_calls"] and step["handler_calls"] * 4 <= step["accepted"], step
    assert step["tasks_per_call"] >= 4


def test_a_bulk_run_is_verified_clean_and_sends_chunks(load_worker):
    name = _sink_type()
    code, report = _loadtest("--type", name, "--bulk", "25", "--steps", "40,80", "--step-seconds", "3",
                             "--chats", "30", "--latency-ms", "5", "--fail-rate", "0.05", "--keep-going")
    assert code in (0, 1), report
    for step in report["steps"]:
        _clean(step)
        assert step["mean_chunk"] >= 1 and step["handler_calls"] is None
        assert step["dispatch_ms"]["p50"] is not None  # from each item's due time


def test_limit_keys_need_a_type_with_a_key_scoped_limit(load_worker):
    from django.core.management.base import CommandError

    name = _sink_type()
    with pytest.raises(CommandError, match=r"--limit-key-count needs a type with a key-scoped limit.*no limits"):
        _loadtest("--type", name, "--limit-key-count", "4", "--steps", "10", "--step-seconds", "1")



def test_a_key_limited_type_runs_clean_with_limit_keys_and_refuses_to_run_without(load_worker):
    from django.core.management.base import CommandError

    from tasks.models import Limit, TaskType, TaskTypeLimit

    name = _sink_type()
    limit = Limit.objects.create(name=unique("ltk"), scope="key", max_in_flight=50)
    TaskTypeLimit.objects.create(task_type=TaskType.objects.get(name=name), limit=limit, position=0)
    with pytest.raises(CommandError, match=r"key-scoped limit .*give --limit-key-count K"):
        _loadtest("--type", name, "--steps", "10", "--step-seconds", "1")
    code, report = _loadtest("--type", name, "--limit-key-count", "3", "--steps", "30", "--step-seconds", "2",
                             "--chats", "30", "--latency-ms", "5", "--fail-rate", "0")
    assert code in (0, 1), report
    (step,) = report["steps"]
    _clean(step)  # every dispatch carried a limit key: none was refused invalid_limit_key
    assert step["rejections"] == {}


def test_batched_never_overwrites_a_type_of_another_handler():
    from django.core.management.base import CommandError

    from tasks.models import TaskType

    name = _sink_type()
    with pytest.raises(CommandError, match=r"runs 'loadtest.sink'; --batched needs a type of loadtest.sink_batch"):
        _loadtest("--type", name, "--batched", "--steps", "10", "--step-seconds", "1")
    assert TaskType.objects.get(name=name).handler == "loadtest.sink"
