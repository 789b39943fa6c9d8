"""The result backend's raw upsert: one statement stores a row, and overwrites it on a second store."""

from __future__ import annotations

import json
from types import SimpleNamespace

from celery import states
from django_celery_results.models import TaskResult

from tasks import results
from tests.support.helpers import unique


def _backend() -> results.UpsertBackend:
    from dispatchsite.celery import app

    backend = app.backend
    assert isinstance(backend, results.UpsertBackend)
    return backend


def _request(task_id: str) -> SimpleNamespace:
    return SimpleNamespace(id=task_id, task="demo.echo", hostname="w1@test", argsrepr="()",
                           kwargsrepr="{'payload': {}}", periodic_task_name=None, children=[], meta={})


def test_store_inserts_one_row_with_every_column():
    task_id = unique("res")
    _backend().store_result(task_id, {"n": 1}, states.SUCCESS, request=_request(task_id))
    row = TaskResult.objects.get(task_id=task_id)
    assert row.status == states.SUCCESS and json.loads(row.result) == {"n": 1}
    assert row.task_name == "demo.echo" and row.worker == "w1@test"
    assert row.content_type == "application/json" and row.content_encoding == "utf-8"
    assert json.loads(row.meta) == {"children": []}
    assert row.date_created is not None and row.date_done is not None and row.date_started is None
    assert _backend().get_task_meta(task_id)["result"] == {"n": 1}


def test_second_store_overwrites_the_row_and_keeps_its_creation_time():
    task_id = unique("res")
    backend = _backend()
    backend.store_result(task_id, {"first": True}, states.SUCCESS, request=_request(task_id))
    first = TaskResult.objects.get(task_id=task_id)
    backend.store_result(task_id, {"exc_type": "ValueError", "exc_message": ["boom"]}, states.FAILURE,
                         traceback="Traceback ...", request=_request(task_id))
    rows = list(TaskResult.objects.filter(task_id=task_id))
    assert len(rows) == 1
    row = rows[0]
    assert row.status == states.FAILURE and row.traceback == "Traceback ..."
    assert json.loads(row.result)["exc_type"] == "ValueError"
    assert row.date_created == first.date_created and row.date_done >= first.date_done


def test_many_rows_in_one_statement_and_a_repeated_id_keeps_its_last_row():
    ids = [unique("res") for _ in range(5)]
    rows = [{"task_id": t, "status": states.SUCCESS, "result": json.dumps(i), "content_type": "application/json",
             "content_encoding": "utf-8"} for i, t in enumerate(ids)]
    rows.append({**rows[0], "status": states.FAILURE, "result": "99"})
    assert results.upsert_rows(None, rows) == 5
    stored = {r.task_id: r for r in TaskResult.objects.filter(task_id__in=ids)}
    assert set(stored) == set(ids)
    assert stored[ids[0]].status == states.FAILURE and stored[ids[0]].result == "99"
    assert [stored[t].result for t in ids[1:]] == ["1", "2", "3", "4"]
    assert results.upsert_rows(None, []) == 0


def test_a_late_retry_state_never_overwrites_a_revoked_row():
    """A cancel of a task parked for its retry writes REVOKED; the worker's RETRY row, stored by Celery
    just after it parked the task, must not replace it (get() would then wait forever)."""
    task_id = unique("res")
    results.store_revoked(task_id, "cancelled by test")
    _backend().store_result(task_id, {"exc_type": "RetryableError"}, states.RETRY, request=_request(task_id))
    assert TaskResult.objects.get(task_id=task_id).status == states.REVOKED
    # A final state still replaces it (a redelivery re-storing its outcome lands on the same row).
    _backend().store_result(task_id, {"n": 1}, states.SUCCESS, request=_request(task_id))
    assert TaskResult.objects.get(task_id=task_id).status == states.SUCCESS
