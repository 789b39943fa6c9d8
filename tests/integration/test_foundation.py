"""The foundation: dispatch to real workers, results, http.post, live config, bad input."""

from __future__ import annotations

import json
import time

import pytest
from django.core.exceptions import ValidationError

from lanes import keys
from tasks.dispatch import dispatch
from tasks.models import DeadLetter, TaskType
from tests.support.helpers import define, lane_depth, unique, wait_until

pytestmark = pytest.mark.usefixtures("lane_worker")


def test_echo_completes_and_result_is_in_the_results_table():
    from django_celery_results.models import TaskResult

    name = unique("echo")
    define(name, handler="demo.echo")
    result = dispatch.delay(name, {"hello": 1})
    assert result.accepted and result.task_id and result.queue == "t-default" and result.priority == 5
    assert result.get(timeout=20) == {"hello": 1}
    row = TaskResult.objects.get(task_id=result.task_id)
    assert row.status == "SUCCESS" and json.loads(row.result) == {"hello": 1}
    assert row.task_name == name  # the task type (Celery's shadow), not its handler


def test_send_task_by_name_goes_through_ingress_admission(lane_worker):
    from dispatchsite.celery import app

    name = unique("byname")
    define(name, handler="demo.echo")
    outer = app.send_task("tasks.dispatch", args=[name, {"n": 7}], kwargs={"priority": 7})
    # The ingress worker serves only ingress: start one for this test.
    assert outer.id
    from tests.support.workers import Worker

    ingress = Worker("ingress", lane_worker.log_path.parent, concurrency=1).start()
    try:
        reply = outer.get(timeout=30)
    finally:
        ingress.stop()
    assert reply["accepted"] is True and reply["priority"] == 7
    from celery.result import AsyncResult

    assert AsyncResult(reply["task_id"], app=app).get(timeout=20) == {"n": 7}
    bad = app.send_task("tasks.dispatch", args=[name, "not an object"])
    ingress = Worker("ingress", lane_worker.log_path.parent, concurrency=1).start()
    try:
        assert bad.get(timeout=30)["reason"] == "invalid_payload"
    finally:
        ingress.stop()


def test_http_post_delivers_with_headers(sink):
    name = unique("hook")
    define(name, handler="http.post", lane="t-http", options={"url": sink.url})
    result = dispatch.delay(name, {"text": "hi"}, idempotency_key="key-1", metadata={"trace": "abc"})
    assert result.get(timeout=20) == {"status": 200}
    (attempt,) = sink.sink.attempts
    assert attempt.body == {"text": "hi"}
    h = attempt.headers
    assert h["Idempotency-Key"] == "key-1"
    assert h["X-Dispatch-Task-Id"] == result.task_id
    assert h["X-Dispatch-Type"] == name
    assert h["X-Dispatch-Attempt"] == "1"
    assert h["X-Dispatch-Chat-Id"] == ""
    assert h["Content-Type"] == "application/json"
    # Without a key, the task id is the idempotency key.
    result2 = dispatch.delay(name, {"text": "again"})
    result2.get(timeout=20)
    assert sink.sink.attempts[-1].headers["Idempotency-Key"] == result2.task_id


def test_http_500_is_retried_and_404_is_not(sink):
    name = unique("hook")
    define(name, handler="http.post", lane="t-http", options={"url": sink.url})
    sink.sink.behaviour.fail_first = 2
    ok = dispatch.delay(name, {"k": 1}, idempotency_key=unique("k"))
    assert ok.get(timeout=30) == {"status": 200}
    assert [a.status for a in sink.sink.attempts_for(ok.task_id if False else sink.sink.attempts[0].key)] == [
        500, 500, 200]
    assert [a.attempt for a in sink.sink.attempts] == [1, 2, 3]

    sink.sink.behaviour.fail_first = 0
    sink.sink.behaviour.always_status = 404
    gone = dispatch.delay(name, {"k": 2}, idempotency_key="k404")
    with pytest.raises(Exception, match="non_retryable"):
        gone.get(timeout=30)
    assert len(sink.sink.attempts_for("k404")) == 1
    row = DeadLetter.objects.get(task_id=gone.task_id)
    assert row.reason == "non_retryable" and row.attempts == 1 and "404" in row.error_message


def test_disallowed_host_is_refused_at_save_and_at_execution(sink):
    name = unique("hook")
    tt = define(name, handler="http.post", lane="t-http", options={"url": sink.url})
    tt.options = {"url": "http://example.com/hook"}
    with pytest.raises(ValidationError) as err:
        tt.full_clean()
    assert "options" in err.value.message_dict and "not allowed" in str(err.value)
    # Bypass validation (as a direct SQL edit would): execution refuses it again.
    TaskType.objects.filter(pk=tt.pk).update(options={"url": "http://example.com/hook"})
    from lanes.config_version import bump_config_version

    bump_config_version()
    result = dispatch.delay(name, {"x": 1})
    with pytest.raises(Exception, match="non_retryable"):
        result.get(timeout=20)
    assert "not allowed" in DeadLetter.objects.get(task_id=result.task_id).error_message
    assert sink.sink.attempts == []


def test_admin_edit_changes_the_next_dispatch_without_restart(admin_client, sink, rc):
    from tests.support.http_sink import SinkServer

    name = unique("edit")
    tt = define(name, handler="http.post", lane="t-http", options={"url": sink.url})
    assert dispatch.delay(name, {"n": 1}).get(timeout=20) == {"status": 200}
    assert len(sink.sink.attempts) == 1
    with SinkServer() as other:
        form = {
            "name": name, "handler": "http.post", "lane": tt.lane.pk, "priority": 8, "enabled": "on",
            "options": json.dumps({"url": other.url}), "timeout": 60, "attempt_timeout": 10,
            "retry_policy": tt.retry_policy.pk, "chat_queue_size": 64, "max_payload_bytes": 65536,
            "idempotency_window": 86400,
        }
        response = admin_client.post(f"/admin/tasks/tasktype/{tt.pk}/change/", form)
        assert response.status_code == 302, response.content[:2000]
        second = dispatch.delay(name, {"n": 2})
        assert second.priority == 8
        assert second.get(timeout=20) == {"status": 200}
        assert len(other.sink.attempts) == 1 and len(sink.sink.attempts) == 1

        # Move the type to a lane no worker serves: the next dispatch waits there.
        from lanes.models import Lane

        parked, _ = Lane.objects.get_or_create(name="t-parked")
        form["lane"] = parked.pk
        assert admin_client.post(f"/admin/tasks/tasktype/{tt.pk}/change/", form).status_code == 302
        before = lane_depth(rc, "t-parked")
        third = dispatch.delay(name, {"n": 3})
        assert third.queue == "t-parked"
        assert lane_depth(rc, "t-parked") == before + 1


def test_admin_form_names_the_bad_field(admin_client):
    name = unique("badform")
    tt = define(name)
    form = {
        "name": name, "handler": "os.system", "lane": tt.lane.pk, "priority": 12, "enabled": "on",
        "options": "{}", "timeout": -1, "attempt_timeout": 10, "retry_policy": tt.retry_policy.pk,
        "chat_queue_size": 64, "max_payload_bytes": 65536, "idempotency_window": 86400,
    }
    response = admin_client.post(f"/admin/tasks/tasktype/{tt.pk}/change/", form)
    assert response.status_code == 200  # the form is shown again with errors
    page = response.content.decode()
    assert "Select a valid choice. os.system is not one of the available choices." in page
    assert "Ensure this value is less than or equal to" in page or "Priority must be between 0 and 9" in page
    tt.refresh_from_db()
    assert tt.handler == "demo.echo"


def _broker_snapshot(rc) -> dict:
    queues = {k: rc.llen(k) for lane in ("t-default", "t-http", "t-parked") for k in keys.lane_queues(lane)}
    records = {k for k in rc.scan_iter("dispatch:*") if b":t:" in k or k.startswith(b"dispatch:t:")}
    chats = {k for k in rc.scan_iter("dispatch:chat:*")}
    return {"queues": queues, "records": records, "chats": chats}


def test_every_bad_input_is_rejected_with_its_reason_and_enqueues_nothing(rc):
    name, chat_name, off = unique("bad"), unique("badchat"), unique("off")
    define(name, max_payload_bytes=1000)
    define(chat_name, chat_scoped=True)
    define(off, enabled=False)
    cases = [
        (("no.such.type", {}), {}, "unknown_type"),
        ((off, {}), {}, "type_disabled"),
        ((name, [1]), {}, "invalid_payload"),
        ((name, {"x": float("nan")}), {}, "invalid_payload"),
        ((name, {"x": "\udcff"}), {}, "invalid_payload"),
        ((name, {"x": "y" * 2000}), {}, "payload_too_large"),
        ((name, {}), {"priority": 10}, "invalid_priority"),
        ((name, {}), {"priority": "high"}, "invalid_priority"),
        ((name, {}), {"timeout": 0}, "invalid_timeout"),
        ((name, {}), {"timeout": 1e12}, "invalid_timeout"),
        ((chat_name, {}), {}, "invalid_chat_id"),
        ((chat_name, {}), {"chat_id": "bad\x00id"}, "invalid_chat_id"),
        ((chat_name, {}), {"chat_id": "c" * 129}, "invalid_chat_id"),
        ((name, {}), {"idempotency_key": "\x00"}, "invalid_idempotency_key"),
        ((name, {}), {"metadata": "nope"}, "invalid_metadata"),
    ]
    time.sleep(0.3)  # let earlier tests' workers settle so the snapshot is quiet
    before = _broker_snapshot(rc)
    for args, kwargs, reason in cases:
        result = dispatch.delay(*args, **kwargs)
        assert not result.accepted and result.reason == reason, (args, kwargs, result)
        assert result.task_id is None and result.detail
    assert _broker_snapshot(rc) == before  # no message, task record or chat queue was written


def test_pickle_message_on_a_lane_is_refused_and_recorded(rc, lane_worker):
    import base64
    import pickle

    task_id = unique("pickled")
    body = base64.b64encode(pickle.dumps(((), {"payload": {}}, {}))).decode()
    message = {
        "body": body, "content-encoding": "binary", "content-type": "application/x-python-serialize",
        "headers": {"lang": "py", "task": "demo.echo", "id": task_id, "retries": 0, "timelimit": [None, None],
                    "root_id": task_id, "parent_id": None, "group": None, "eta": None, "expires": None},
        "properties": {"correlation_id": task_id, "reply_to": "", "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": "t-default"}, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": task_id},
    }
    rc.lpush("t-default", json.dumps(message))
    row = wait_until(lambda: DeadLetter.objects.filter(task_id=task_id).first(), what="malformed dead letter")
    assert row.reason == "malformed" and "Refusing to deserialize untrusted content" in row.error_message
    assert lane_worker.alive()
    name = unique("after")
    define(name)
    assert dispatch.delay(name, {"still": "serving"}).get(timeout=20) == {"still": "serving"}
