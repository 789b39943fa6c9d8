"""Throttle and debounce with a real worker: what runs, what ends REVOKED, nothing lost."""

from __future__ import annotations

import itertools
import time

import pytest
from celery.exceptions import TaskRevokedError

from lanes import keys
from tasks import config
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until
from tests.support.http_sink import SinkServer
from tests.support.workers import Worker


@pytest.fixture(scope="module")
def sink():
    with SinkServer() as server:
        yield server


@pytest.fixture(scope="module")
def served(tmp_root, sink):
    """One worker for the module (its start is most of these tests' time)."""
    lane = unique("t-ddw")
    names = {mode: define(unique(f"ddw-{mode}"), handler="http.post", lane=lane, options={"url": sink.url},
                          timeout=60, dedupe=mode, dedupe_window=window).name
             for mode, window in (("throttle", 1.0), ("debounce", 0.5))}
    config.forget()
    worker = Worker(lane, tmp_root / "logs", pool="threads", concurrency=2).start()
    yield names
    worker.discard()


def _ran(sink, tasks) -> list:
    """The payloads' ``n`` the sink received from ``tasks``, in arrival order."""
    ids = {t.task_id for t in tasks}
    return [a.body["n"] for a in sink.sink.attempts if a.key in ids]


def test_throttle_runs_the_first_of_its_window_and_one_after_it(served, sink):
    name = served["throttle"]
    answers = [dispatch.delay(name, {"n": n}, dedupe_key="digest") for n in range(20)]
    first = answers[0]
    assert first.accepted and not first.duplicate
    assert all(a.accepted and a.duplicate and a.task_id == first.task_id for a in answers[1:])
    assert first.get(timeout=30) is not None
    time.sleep(1.1)  # the window (1 s) has passed
    later = dispatch.delay(name, {"n": 20}, dedupe_key="digest")
    assert later.accepted and not later.duplicate and later.task_id != first.task_id
    later.get(timeout=30)
    assert _ran(sink, [first, later]) == [0, 20]


def test_debounce_runs_only_the_last_of_a_burst_and_revokes_the_rest(served, sink, rc):
    name = served["debounce"]
    burst = [dispatch.delay(name, {"n": n}, dedupe_key="typing") for n in range(10)]
    assert all(a.accepted for a in burst)
    assert [a.replaced for a in burst] == [None] + [a.task_id for a in burst[:-1]]
    burst[-1].get(timeout=30)
    for earlier, later in itertools.pairwise(burst):
        with pytest.raises(TaskRevokedError, match=f"replaced by {later.task_id}"):
            earlier.get(timeout=10)
    time.sleep(0.6)  # a replaced one that still ran would have by now
    assert _ran(sink, burst) == [9]


def test_a_debounce_whose_earlier_task_started_is_admitted_beside_it(served, sink, rc):
    name = served["debounce"]
    running = dispatch.delay(name, {"n": 1, "sink_delay_s": 1.5}, dedupe_key="busy")
    wait_until(lambda: rc.hget(keys.task_record(running.task_id), "st") == b"running", timeout=30,
               what="the first one running")
    second = dispatch.delay(name, {"n": 2}, dedupe_key="busy")
    assert second.accepted and second.replaced is None
    running.get(timeout=30)
    second.get(timeout=30)
    assert sorted(_ran(sink, [running, second])) == [1, 2]
