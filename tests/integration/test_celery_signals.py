"""Celery's own task signals with real thread-pool workers: a plain task run in a group gets what Celery's
per-message path gives it (``task_received``, ``task_prerun``, ``task_postrun``, ``task_success`` or
``task_failure``), once each, as a worker with grouping off does for the same tasks.

Receivers come from ``DISPATCH_HOOK_MODULES=tests.support.celery_signal_recorder``, writing to Redis.
"""

from __future__ import annotations

from collections import Counter

from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until

RECORDER = "tests.support.celery_signal_recorder"


def _signals_of(rc, ids: list[str]) -> dict[str, Counter]:
    from tests.support.celery_signal_recorder import read

    by_id: dict[str, Counter] = {task_id: Counter() for task_id in ids}
    for event in read(rc):
        if event["id"] in by_id:
            by_id[event["id"]][event["signal"]] += 1
    return by_id


def _run(rc, start_worker, grouping: bool) -> list[Counter]:
    lane, ok_type, bad_type = unique("csig"), unique("csig-ok"), unique("csig-bad")
    define(ok_type, lane=lane)
    define(bad_type, lane=lane, handler="demo.flaky", policy={"max_retries": 0})
    start_worker(lane, pool="threads", concurrency=4,
                 env={"DISPATCH_HOOK_MODULES": RECORDER, "DISPATCH_GROUPING": "1" if grouping else "0"})
    sent = [dispatch.delay(ok_type, {"n": n}) for n in range(5)] + [dispatch.delay(bad_type, {"fail": "fatal"})]
    assert all(result.accepted for result in sent)
    ids = [result.task_id for result in sent]
    for result in sent[:5]:
        assert result.get(timeout=30) is not None
    # The last signal of each task (postrun) is sent after its outcome is recorded: wait for it.
    wait_until(lambda: all(c["task_postrun"] for c in _signals_of(rc, ids).values()), timeout=30,
               what="task_postrun of every task")
    return [_signals_of(rc, ids)[task_id] for task_id in ids]


def test_a_grouped_plain_task_gets_celerys_task_signals_as_celerys_own_path_gives_them(rc, start_worker):
    grouped = _run(rc, start_worker, grouping=True)
    celery_path = _run(rc, start_worker, grouping=False)
    for counts in grouped[:5]:
        assert counts == Counter(task_received=1, task_prerun=1, task_postrun=1, task_success=1), grouped
    assert grouped[5]["task_received"] == 1 and grouped[5]["task_success"] == 0, grouped
    assert grouped == celery_path, (grouped, celery_path)
