"""Issue 13 item 8: task-type checks shared by the admin form and apply_config, and the dead letter's Requeue page."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from tasks import dead_letters, registry
from tasks.config_io import apply_config
from tasks.errors import ConfigError
from tasks.models import DeadLetter, TaskType
from tests.integration.test_config_io import config
from tests.support.helpers import define, unique


def test_unknown_option_key_is_refused_naming_it():
    expected = "unknown option 'urll' for handler 'http.post'; known options: url, headers"
    with pytest.raises(ValueError, match=re.escape(expected)):
        registry.validate_options("http.post", {"url": "http://127.0.0.1/x", "urll": "http://127.0.0.1/y"})
    registry.validate_options("http.post", {"url": "http://127.0.0.1/x", "headers": {"A": "b"}})


@pytest.mark.parametrize("override, named", [
    ({"handler": "http.post", "options": {"urll": "http://127.0.0.1/x"}}, "unknown option 'urll'"),
    ({"timeout": 30, "attempt_timeout": 45}, "attempt_timeout: Attempt timeout (45 s) must not be above the timeout"),
])
def test_apply_config_refuses_what_the_admin_refuses(override, named):
    prefix = unique("cfg-web")
    with pytest.raises(ConfigError, match=re.escape(named)):
        apply_config(config(prefix, **override))
    assert not TaskType.objects.filter(name=f"{prefix}.echo").exists()


def _add_form(tt: TaskType, **fields) -> dict:
    return {"name": unique("form-type"), "handler": "http.post", "lane": tt.lane_id, "priority": 5,
            "enabled": "on", "options": json.dumps({"url": "http://127.0.0.1:9/x"}), "timeout": 60,
            "attempt_timeout": 10, "retry_policy": tt.retry_policy_id, "chat_queue_size": 64,
            "max_payload_bytes": 65536, "idempotency_window": 86400, **fields}


def _errors(html: str) -> list[str]:
    """Every error message of a rendered admin form."""
    lists = re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', html, re.S)
    return [unescape(m) for block in lists for m in re.findall(r"<li>(.*?)</li>", block, re.S)]


def test_admin_form_errors(admin_client):
    tt = define(unique("form-base"))
    cases = [
        ({"options": '{"url": '}, "Enter a valid JSON."),
        ({"options": json.dumps({"urll": "http://127.0.0.1:9/x"})}, "unknown option 'urll' for handler 'http.post'"),
        ({"timeout": 30, "attempt_timeout": 60}, "Attempt timeout (60 s) must not be above the timeout (30 s)"),
    ]
    for fields, expected in cases:
        data = _add_form(tt, **fields)
        response = admin_client.post("/admin/tasks/tasktype/add/", data)
        assert response.status_code == 200, fields
        errors = _errors(response.content.decode())
        assert len(errors) == 1 and expected in errors[0], (fields, errors)  # only the one true error
        assert not TaskType.objects.filter(name=data["name"]).exists()
    ok = _add_form(tt)
    assert admin_client.post("/admin/tasks/tasktype/add/", ok).status_code == 302
    assert TaskType.objects.get(name=ok["name"]).options == {"url": "http://127.0.0.1:9/x"}


def _row() -> DeadLetter:
    name = unique("det-type")
    define(name, lane=unique("det-lane"))
    return dead_letters.record(task_id=unique("det-task"), task_type=name, lane="x", reason="exhausted",
                               payload={"n": 1})


def test_detail_requeue_needs_the_permission_and_a_post(admin_client):
    row = _row()
    url = f"/admin/tasks/deadletter/{row.pk}/requeue/"
    viewer = get_user_model().objects.create_user(unique("dl-viewer"), password="pw-x-12345", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    client = Client()
    client.force_login(viewer)
    page = client.get(f"/admin/tasks/deadletter/{row.pk}/change/")
    assert page.status_code == 200 and b"requeue-button" not in page.content
    assert client.post(url).status_code == 403
    assert admin_client.get(url).status_code == 405
    row.refresh_from_db()
    assert row.status == "dead"

    assert b"requeue-button" in admin_client.get(f"/admin/tasks/deadletter/{row.pk}/change/").content
    response = admin_client.post(url, follow=True)
    row.refresh_from_db()
    assert row.status == "requeued"
    assert f"requeued as task {row.requeued_task_id}" in response.content.decode()
    again = admin_client.post(url, follow=True)
    assert "already requeued" in again.content.decode()


@pytest.mark.parametrize("options", ['"\\ud800"', '{"url": "http://127.0.0.1:9/x", "headers": {"a": "\\udc00"}}'])
def test_options_with_a_lone_surrogate_are_refused_not_a_500(admin_client, options):
    """Found by test_admin_properties: valid JSON whose text is no valid Unicode broke the page (500)."""
    tt = define(unique("form-sur"))
    data = _add_form(tt, options=options)
    response = admin_client.post("/admin/tasks/tasktype/add/", data)
    assert response.status_code == 200
    errors = _errors(response.content.decode())
    assert len(errors) == 1 and "valid Unicode" in errors[0], errors
    assert not TaskType.objects.filter(name=data["name"]).exists()


def test_dead_letter_page_shows_a_payload_with_a_lone_surrogate(admin_client):
    row = _row()
    DeadLetter.objects.filter(pk=row.pk).update(payload={"text": "\ud800"}, metadata={"m": "\udfff"})
    response = admin_client.get(f"/admin/tasks/deadletter/{row.pk}/change/")
    assert response.status_code == 200
    assert "\\ud800" in response.content.decode()
