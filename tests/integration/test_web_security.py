"""Issue 12: the operator's pages answer no reflected markup, send CSP and nosniff, and gate Flower and lane toggles."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from lanes.models import Lane
from tests.support.helpers import unique

XSS = "<img src=x onerror=alert(document.domain)>"
XSS_PATH = "/admin/dashboard/lanes/realtime/%3Cimg%20src%3Dx%20onerror%3Dalert(document.domain)%3E/"


def _staff(*perms: str) -> Client:
    """A logged-in staff user holding only ``perms`` (``app.codename``)."""
    user = get_user_model().objects.create_user(unique("staff"), password="pw-staff-123", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    client = Client()
    client.force_login(user)
    return client


def _assert_not_html(response) -> None:
    assert response["Content-Type"].startswith("text/plain"), response["Content-Type"]


def test_unknown_lane_action_is_not_reflected_as_html(admin_client):
    response = admin_client.get(XSS_PATH)
    assert response.status_code == 404
    _assert_not_html(response)
    assert "Content-Security-Policy" in response


def test_unknown_lane_name_is_not_reflected_as_html(admin_client):
    response = admin_client.get(f"/admin/dashboard/lanes/{XSS.replace(' ', '%20')}/close/")
    assert response.status_code == 404
    _assert_not_html(response)


def test_lane_control_checks_the_permission_before_looking_at_the_url():
    client = _staff()
    response = client.get(XSS_PATH)
    assert response.status_code == 403
    assert b"<img" not in response.content
    _assert_not_html(response)


@pytest.mark.parametrize("path", ["/admin/", "/admin/login/", "/admin/dashboard/", "/admin/dashboard/data/",
                                  "/metrics", "/admin/tasks/deadletter/", XSS_PATH])
def test_csp_and_nosniff_on_every_page(admin_client, path):
    response = admin_client.get(path)
    assert response.status_code in {200, 302, 404}, (path, response.status_code)
    policy = response["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy
    assert response["X-Content-Type-Options"] == "nosniff"


def test_csp_and_nosniff_for_a_logged_out_visitor():
    client = Client()
    for path in ("/admin/login/", "/metrics", "/admin/dashboard/"):
        response = client.get(path)
        assert "Content-Security-Policy" in response, path
        assert response["X-Content-Type-Options"] == "nosniff", path


def test_flower_needs_the_flower_permission():
    assert Client().get("/admin/flower-auth/").status_code == 401
    assert _staff().get("/admin/flower-auth/").status_code == 403
    assert _staff("lanes.control_lane").get("/admin/flower-auth/").status_code == 403
    assert _staff("lanes.use_flower").get("/admin/flower-auth/").status_code == 204


def test_flower_auth_allows_a_superuser(admin_client):
    assert admin_client.get("/admin/flower-auth/").status_code == 204


def _toggle_post(client: Client, lane: Lane, accepting: bool):
    """The changelist's own form: the ``accepting`` checkbox of one row, saved."""
    data = {
        "form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-MIN_NUM_FORMS": "0", "form-MAX_NUM_FORMS": "1000",
        "form-0-id": str(lane.pk), "_save": "Save",
    }
    if accepting:
        data["form-0-accepting"] = "on"
    return client.post(f"/admin/lanes/lane/?q={lane.name}", data)


def test_changelist_toggle_needs_the_lane_control_permission():
    lane = Lane.objects.create(name=unique("gate"), capacity=10, accepting=True)
    editor = _staff("lanes.view_lane", "lanes.change_lane")
    page = editor.get(f"/admin/lanes/lane/?q={lane.name}")
    assert page.status_code == 200 and b'name="form-0-accepting"' not in page.content
    response = _toggle_post(editor, lane, accepting=False)
    assert response.status_code in {200, 302}
    lane.refresh_from_db()
    assert lane.accepting is True

    controller = _staff("lanes.view_lane", "lanes.change_lane", "lanes.control_lane")
    assert b'name="form-0-accepting"' in controller.get(f"/admin/lanes/lane/?q={lane.name}").content
    assert _toggle_post(controller, lane, accepting=False).status_code == 302
    lane.refresh_from_db()
    assert lane.accepting is False


def test_lane_form_toggle_needs_the_lane_control_permission():
    lane = Lane.objects.create(name=unique("gate-form"), capacity=10, accepting=True)
    editor = _staff("lanes.view_lane", "lanes.change_lane")
    response = editor.post(f"/admin/lanes/lane/{lane.pk}/change/",
                           {"name": lane.name, "capacity": "20", "description": "x"})
    assert response.status_code == 302
    lane.refresh_from_db()
    assert lane.capacity == 20 and lane.accepting is True


def test_dead_letter_search_uses_indexed_lookups_only(admin_client):
    """Issue 12: exact task id, chat id prefix, exact idempotency key; never a ``LIKE '%...%'`` scan."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tasks import dead_letters

    chat, key = unique("srch-chat"), unique("srch-key")
    row = dead_letters.record(task_id=unique("srch-task"), task_type="t", lane="l", reason="expired",
                              payload={}, chat_id=chat, idempotency_key=key)
    for term, found in ((row.task_id, True), (row.task_id[3:], False), (chat[:-3], True), (chat[3:], False),
                        (key, True), (key[:-2], False)):
        with CaptureQueriesContext(connection) as queries:
            response = admin_client.get("/admin/tasks/deadletter/", {"q": term, "status__exact": "dead"})
        assert response.status_code == 200
        assert (row.task_id in response.content.decode()) is found, term
        scans = [q["sql"] for q in queries.captured_queries if "tasks_deadletter" in q["sql"] and "LIKE '%" in q["sql"]]
        assert not scans, scans  # a leading wildcard: no index can answer it
    page = admin_client.get("/admin/tasks/deadletter/")
    assert b"Exact task id, chat id prefix, or exact idempotency key" in page.content


def _check_deploy(tmp_path, **env_overrides: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG", "DJANGO_SETTINGS_MODULE"}}
    env.update(DISPATCH_PROFILE="production", DISPATCH_SECRETS_FILE=str(tmp_path / "secrets.json"),
               DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", **env_overrides)
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_check_deploy_has_no_warnings_in_the_production_profile(tmp_path):
    """Issue 12: the production profile with the generated secrets file passes Django's deployment checks."""
    done = _check_deploy(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


def test_check_deploy_would_report_a_weak_setting(tmp_path):
    """The check above can fail: a weak secret key or DEBUG on is reported."""
    done = _check_deploy(tmp_path, SECRET_KEY="short", DEBUG="true")
    assert done.returncode != 0
    assert "security.W009" in done.stderr and "security.W018" in done.stderr
