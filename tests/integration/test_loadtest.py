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
    worker.stop(timeout=20)


def _sink_type() -> str:
    name = unique("lt")
    define(name, handler="loadtest.sink", lane=LANE, chat_scoped=True, chat_queue_size=1000,
           policy={"max_retries": 8, "initial_backoff": 0.05, "max_backoff": 0.2})
    return name


def test_small_stepped_load_is_verified_clean(load_worker, tmp_path):
    name = _sink_type()
    plot = tmp_path / "steps.png"
    code, report = _loadtest("--type", name, "--steps", "20,40", "--step-seconds", "3", "--chats", "30",
                             "--latency-ms", "5", "--fail-rate", "0.05", "--plot", str(plot))
    assert code == 0, report
    assert [s["rate"] for s in report["steps"]] == [20, 40]
    for step in report["steps"]:
        assert step["passed"], step
        assert (step["lost"], step["duplicates"], step["order_violations"], step["unknown"]) == (0, 0, 0, 0)
        assert step["accepted"] == step["sent"] == step["applied"] + step["dead"] > 0
        assert step["drained"] and step["pending"] == 0
        assert step["e2e_ms"]["p99"] is not None and step["dispatch_ms"]["p50"] is not None
        # Costs are measured, not assumed: admission runs one Lua call per dispatch at least.
        assert step["redis_commands_per_task"] > 0 and step["evalsha_per_task"] >= 1
        assert step["dispatch_round_trips_per_task"] >= 1
    assert report["sustained_rate"] == 40
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
