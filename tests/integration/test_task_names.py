"""Flower and the worker log name a task by its type (Celery's ``shadow``), not by its handler;
a dead letter's failure names its type, reason and admin URL."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.helpers import define, unique, wait_until

LANE = "t-shadow"


@pytest.fixture(scope="module")
def shadow_worker(tmp_root):
    from tests.support.workers import Worker

    worker = Worker(LANE, tmp_root / "logs", concurrency=2, env={"CELERY_WORKER_SEND_TASK_EVENTS": "true"},
                    extra=["-E"]).start()
    yield worker
    worker.stop(timeout=20)


class _Events:
    """Collects the task events the workers send (what Flower reads)."""

    def __init__(self) -> None:
        from celery import current_app

        self.app = current_app
        self.seen: list[dict] = []
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._receiver = None

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self.seen.append})
            self.ready.set()
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> _Events:
        self._thread.start()
        self.ready.wait(10)
        time.sleep(0.5)  # the receiver's queue is bound once capture starts consuming
        return self

    def __exit__(self, *exc) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=5)


def test_worker_events_and_log_name_the_task_type(shadow_worker):
    from tasks.dispatch import dispatch

    type_name = unique("shown.type")
    define(type_name, handler="demo.echo", lane=LANE)
    with _Events() as events:
        result = dispatch.delay(type_name, {"x": 1})
        assert result.accepted, result
        assert result.get(timeout=60) == {"x": 1}
        # The task's received event, or the ending it is folded into (tasks.worker_events): either names it.
        received = wait_until(lambda: [e for e in events.seen if e.get("uuid") == result.task_id and "name" in e],
                              timeout=20, what="a task event naming the task")
    assert received[0]["name"] == type_name
    wait_until(lambda: f"Task {type_name}[{result.task_id}] received" in shadow_worker.log_text(), timeout=10,
               what="the worker's received line naming the type")
    assert f"Task demo.echo[{result.task_id}]" not in shadow_worker.log_text()


def test_dead_letter_failure_names_type_reason_and_admin_url(shadow_worker):
    from django.conf import settings
    from django_celery_results.models import TaskResult

    from tasks.dispatch import dispatch
    from tasks.errors import DeadLettered

    type_name = unique("dying.type")
    define(type_name, handler="demo.flaky", lane=LANE, policy={"max_retries": 0})
    result = dispatch.delay(type_name, {"fail": "fatal"})
    assert result.accepted, result
    exc = result.get(timeout=60, propagate=False)
    assert isinstance(exc, DeadLettered)
    url = f"{settings.DISPATCH_ADMIN_URL}tasks/deadletter/?task_id={result.task_id}"
    text = str(exc)
    assert type_name in text and "non_retryable" in text and url in text, text
    row = wait_until(lambda: TaskResult.objects.filter(task_id=result.task_id, status="FAILURE").first(),
                     timeout=20, what="the result row")
    assert type_name in row.result and url in row.result


@pytest.mark.parametrize("pool", ["prefork", "threads"])  # threads: the worker runs plain tasks in groups
def test_result_row_and_api_name_the_task_type(request, pool, start_worker):
    """*Celery Results* in the admin and the API's ``task_name`` show the type, as Flower does."""
    from django_celery_results.models import TaskResult

    from tasks.dispatch import dispatch

    lane = f"{LANE}-{pool}"
    if pool == "prefork":
        request.getfixturevalue("shadow_worker")
        lane = LANE
    else:
        start_worker(lane, pool="threads", concurrency=4)
    type_name = unique("partner.greet")
    define(type_name, handler="demo.echo", lane=lane)
    result = dispatch.delay(type_name, {"hi": 1})
    assert result.accepted, result
    assert result.get(timeout=60) == {"hi": 1}
    assert TaskResult.objects.get(task_id=result.task_id).task_name == type_name
