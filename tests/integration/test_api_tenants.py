"""Every caller in its own room: two (or three) tokens on the same types, real Redis.

Each test reproduces one finding of the outside review on the code before the
fix (one token reading, taking or blocking another's tasks, a bulk filling a
lane for a week, view-only staff revoking tokens) and holds the fix.
"""

from __future__ import annotations

import json

import pytest

from tests.support.api_client import ApiClient, make_token
from tests.support.helpers import define, unique


def _body(response) -> dict:
    assert response["Content-Type"].startswith("application/json"), (response.status_code, response.content[:300])
    return json.loads(response.content)


@pytest.fixture
def plain_type():
    name = unique("ten-plain")
    define(name, handler="demo.echo", lane="t-tenants", timeout=30)
    return name


@pytest.fixture
def chat_type():
    name = unique("ten-chat")
    define(name, handler="demo.echo", lane="t-tenants", chat_scoped=True, chat_queue_size=2, timeout=30)
    return name


def _two(*types: str) -> tuple[ApiClient, ApiClient]:
    return (ApiClient(make_token(unique("svc-a"), list(types), rate_per_s=100_000)),
            ApiClient(make_token(unique("svc-b"), list(types), rate_per_s=100_000)))


def _send(client: ApiClient, task_type: str, **fields):
    return client.post("/dispatch", {"task_type": task_type, "payload": fields.pop("payload", {"n": 1}), **fields})


# --- 1. a token reads only its own tasks, and a conflict names no other caller's task ---------------

def test_another_tokens_task_is_404_like_an_unknown_id(plain_type):
    other_type = unique("ten-other")
    define(other_type, handler="demo.echo", lane="t-tenants")
    a, b = _two(plain_type)
    c = ApiClient(make_token(unique("svc-c"), [other_type]))
    mine = _body(_send(a, plain_type, countdown=20.0))
    assert mine["accepted"] is True
    assert _body(a.get(f"/tasks/{mine['task_id']}"))["state"] == "SCHEDULED"
    never = mine["task_id"][:-4] + "0000"
    for reader in (b, c):
        seen, unknown = reader.get(f"/tasks/{mine['task_id']}"), reader.get(f"/tasks/{never}")
        assert (seen.status_code, unknown.status_code) == (404, 404)
        assert _body(seen)["reason"] == _body(unknown)["reason"] == "unknown_task"
        assert _body(seen)["detail"].replace(mine["task_id"], never) == _body(unknown)["detail"]


def test_idempotency_keys_are_per_caller(plain_type):
    a, b = _two(plain_type)
    key = unique("order")
    first = _body(_send(a, plain_type, payload={"who": "a"}, idempotency_key=key))
    taken = _body(_send(b, plain_type, payload={"who": "b"}, idempotency_key=key))
    assert taken["accepted"] is True and taken["duplicate"] is False and taken["task_id"] != first["task_id"]
    again = _body(_send(a, plain_type, payload={"who": "a"}, idempotency_key=key))
    assert again["duplicate"] is True and again["task_id"] == first["task_id"]
    conflict = _send(b, plain_type, payload={"who": "b2"}, idempotency_key=key)
    assert conflict.status_code == 409 and _body(conflict)["reason"] == "idempotency_conflict"
    detail = _body(conflict)["detail"]
    assert first["task_id"] not in detail and repr(key) in detail and "tk" not in detail.replace(taken["task_id"], "")


def test_a_bulk_conflict_names_no_other_callers_task_on_a_shared_type():
    shared = unique("ten-shared")
    define(shared, handler="demo.echo", lane="t-tenants", shared=True)
    a, b = _two(shared)
    key = unique("k")
    first = _body(_send(a, shared, payload={"n": 1}, idempotency_key=key))
    r = b.post("/dispatch/bulk", {"task_type": shared, "items": [{"payload": {"n": 2}, "idempotency_key": key}]})
    (item,) = _body(r)["results"]
    assert item["reason"] == "idempotency_conflict" and first["task_id"] not in item["detail"]
    assert "another caller's task" in item["detail"]


# --- 2. a token cannot block or fill another caller's chat ------------------------------------------

def test_chat_ids_are_per_caller(chat_type):
    a, b = _two(chat_type)
    parked = _body(_send(b, chat_type, chat_id="c1", countdown=25.0))
    filler = _body(_send(b, chat_type, chat_id="c1"))
    assert parked["accepted"] and filler["accepted"] and filler["position"] == 2
    full = _send(b, chat_type, chat_id="c1")
    assert full.status_code == 429 and _body(full)["reason"] == "chat_queue_full"
    assert "'c1'" in _body(full)["detail"] and "tk" not in _body(full)["detail"]  # its own name, shown back
    mine = _body(_send(a, chat_type, chat_id="c1"))
    assert mine["accepted"] is True and mine["position"] == 1  # not behind b's parked head


def test_a_shared_type_shares_chats_and_keys_and_says_so():
    from tasks.models import TaskType

    shared = unique("ten-shared-chat")
    define(shared, handler="demo.echo", lane="t-tenants", chat_scoped=True, shared=True)
    assert "another caller" in str(TaskType._meta.get_field("shared").help_text)
    a, b = _two(shared)
    head = _body(_send(a, shared, chat_id="room", countdown=20.0))
    behind = _body(_send(b, shared, chat_id="room"))
    assert head["accepted"] and behind["position"] == 2
    key = unique("k")
    first = _body(_send(a, shared, chat_id="room2", idempotency_key=key))
    dup = _body(_send(b, shared, chat_id="room2", idempotency_key=key))
    assert dup["duplicate"] is True and dup["task_id"] == first["task_id"]
    assert b.get(f"/tasks/{first['task_id']}").status_code == 404  # still a's to read


# --- 3. quotas: items count, timeouts and delays capped -----------------------------------------------

def test_a_bulk_counts_each_item_against_the_tokens_rate(plain_type):
    from api.models import DispatchAudit

    client = ApiClient(make_token(unique("svc"), [plain_type], rate_per_s=5))
    r = client.post("/dispatch/bulk", {"task_type": plain_type, "items": [{"n": i} for i in range(50)]})
    assert r.status_code == 429 and _body(r)["reason"] == "rate_limited" and int(r["Retry-After"]) >= 1
    assert "50 items" in _body(r)["detail"]
    assert not DispatchAudit.objects.filter(task_type=plain_type).exists()  # nothing reached admission


def test_a_token_at_its_share_of_the_lane_is_refused_caller_quota_while_another_gets_in():
    """A holds 10 % of a capacity-50 lane: its 6th waiting task is refused (429, Retry-After); B still gets in,
    in one request or in bulk, and a task of A that leaves waiting (cancelled) makes room again."""
    name = unique("ten-share")
    define(name, handler="demo.echo", lane=unique("t-share"), capacity=50, timeout=300)
    a = ApiClient(make_token(unique("svc-a"), [name], rate_per_s=100_000, lane_share=10))
    b = ApiClient(make_token(unique("svc-b"), [name], rate_per_s=100_000))
    held = [_body(_send(a, name, payload={"n": n})) for n in range(5)]
    assert all(r["accepted"] for r in held)
    refused = _send(a, name, payload={"n": 5})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert _body(refused)["reason"] == "caller_quota" and "10%" in _body(refused)["detail"]
    assert _body(_send(b, name, payload={"n": 0}))["accepted"] is True
    bulk = _body(a.post("/dispatch/bulk", {"task_type": name, "items": [{"n": n} for n in range(3)]}))
    assert [r["reason"] for r in bulk["results"]] == ["caller_quota"] * 3
    bulk = _body(b.post("/dispatch/bulk", {"task_type": name, "items": [{"n": n} for n in range(30)]}))
    assert bulk["accepted"] == 30
    assert a.post(f"/tasks/{held[0]['task_id']}/cancel").status_code == 200
    again = [_body(_send(a, name, payload={"n": n})) for n in (6, 7)]
    assert [r["accepted"] for r in again] == [True, False] and again[1]["reason"] == "caller_quota"


def test_the_lane_share_is_on_the_tokens_admin_form_and_checked():
    from django.contrib.auth.models import User
    from django.core.exceptions import ValidationError
    from django.test import Client

    from api.models import ServiceToken

    admin = User.objects.create_superuser(unique("share-admin"), password="pw-share-1")
    client = Client()
    client.force_login(admin)
    page = client.get("/admin/api/servicetoken/add/").content.decode()
    assert 'name="lane_share"' in page and "caller_quota" in page
    row = ServiceToken(name=unique("svc-bad-share"), lane_share=0)
    row.set_new_secret()
    with pytest.raises(ValidationError, match="lane_share"):
        row.full_clean()


@pytest.mark.parametrize("extra,reason", [
    ({"timeout": 604800.0}, "invalid_timeout"),
    ({"timeout": 31.0}, "invalid_timeout"),
    ({"countdown": 518400.0}, "invalid_eta"),
    ({"countdown": 20.0, "timeout": 25.0}, None),
])
def test_a_callers_timeout_and_delay_are_capped_by_the_type(plain_type, extra, reason):
    from tasks.models import TaskType

    TaskType.objects.filter(name=plain_type).update(max_delay=20)
    TaskType.objects.get(name=plain_type).save()  # bump the config version
    a, _ = _two(plain_type)
    one = _body(_send(a, plain_type, **extra))
    bulk = _body(a.post("/dispatch/bulk", {"task_type": plain_type, "items": [{"n": 1}], **extra}))["results"][0]
    for got in (one, bulk):
        assert got["reason"] == reason, got
        assert got["accepted"] is (reason is None)


def test_a_token_names_only_the_retry_policies_listed_on_it(plain_type):
    from tasks.models import RetryPolicy

    RetryPolicy.objects.update_or_create(name="ten-patient", defaults={"max_retries": 100})
    RetryPolicy.objects.update_or_create(name="ten-brief", defaults={"max_retries": 1})
    client = ApiClient(make_token(unique("svc"), [plain_type], retry_policies=["ten-brief"]))
    r = _send(client, plain_type, retry_policy="ten-patient")
    assert r.status_code == 403 and _body(r)["reason"] == "forbidden_retry_policy" and "ten-brief" in _body(r)["detail"]
    r = client.post("/dispatch/bulk", {"task_type": plain_type, "items": [{}], "retry_policy": "ten-patient"})
    assert r.status_code == 403
    assert _send(client, plain_type, retry_policy="ten-brief").status_code == 202


# --- the rest of the HTTP door ------------------------------------------------------------------------

def test_cancel_over_http_own_tasks_only(plain_type):
    a, b = _two(plain_type)
    task_id = _body(_send(a, plain_type, countdown=25.0))["task_id"]
    r = b.post(f"/tasks/{task_id}/cancel", {"reason": "not yours"})
    assert r.status_code == 404 and _body(r)["reason"] == "unknown_task"
    assert _body(a.get(f"/tasks/{task_id}"))["state"] == "SCHEDULED"  # b's try changed nothing
    r = a.post(f"/tasks/{task_id}/cancel", {"reason": "changed my mind"})
    assert r.status_code == 200 and _body(r)["outcome"] == "cancelled"
    state = _body(a.get(f"/tasks/{task_id}"))
    assert state["state"] == "REVOKED" and "changed my mind" in json.dumps(state["result"])
    again = a.post(f"/tasks/{task_id}/cancel")
    assert again.status_code == 200 and _body(again)["outcome"] == "already_cancelled"
    never = a.post(f"/tasks/{task_id[:-4]}0000/cancel")
    assert never.status_code == 404 and _body(never)["reason"] == "unknown_task"


def test_every_error_is_json_post_to_an_unknown_path_and_a_wrong_method(plain_type):
    from django.test import Client

    a, _ = _two(plain_type)
    browser = Client(enforce_csrf_checks=True)
    r = browser.post("/api/v1/nope", data="{}", content_type="application/json",
                     HTTP_AUTHORIZATION=f"Bearer {a.token}")
    assert r.status_code == 404 and _body(r)["reason"] == "not_found"
    r = a.get("/dispatch")
    assert r.status_code == 405 and _body(r)["reason"] == "method_not_allowed" and "POST" in r["Allow"]
    r = a.client.put("/api/v1/tasks/x", data="{}", content_type="application/json")
    assert r.status_code == 405 and _body(r)["reason"] == "method_not_allowed"


# --- 4. admin: view-only staff cannot revoke; every action declares its permissions --------------------

def test_view_only_staff_cannot_revoke_a_token_and_a_revoke_is_logged(plain_type):
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    from api.models import ServiceToken

    name = unique("svc-victim")
    victim = ApiClient(make_token(name, [plain_type]))
    row = ServiceToken.objects.get(name=name)
    viewer = User.objects.create_user(unique("viewer"), password="pw-viewer-1", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_servicetoken"))
    client = Client()
    client.force_login(viewer)
    assert client.get("/admin/api/servicetoken/").status_code == 200
    r = client.post("/admin/api/servicetoken/", {"action": "revoke", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.revoked_at is None, r.status_code
    assert _send(victim, plain_type).status_code == 202

    changer = User.objects.create_user(unique("changer"), password="pw-changer-1", is_staff=True)
    changer.user_permissions.add(*Permission.objects.filter(codename__in=["view_servicetoken",
                                                                          "change_servicetoken"]))
    client.force_login(changer)
    client.post("/admin/api/servicetoken/", {"action": "revoke", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.revoked_at is not None
    assert LogEntry.objects.filter(object_id=str(row.pk), user=changer, change_message__icontains="revoked").exists()
    assert _send(victim, plain_type).status_code == 401


def test_every_admin_action_declares_its_permissions():
    from django.contrib import admin

    missing = []
    for model, model_admin in admin.site._registry.items():
        for action in (model_admin.actions or ()):
            func = action if callable(action) else getattr(model_admin, action)
            if not getattr(func, "allowed_permissions", None):
                missing.append(f"{model._meta.label}.{getattr(func, '__name__', action)}")
    for name, func in admin.site._global_actions.items():
        if not getattr(func, "allowed_permissions", None):
            missing.append(f"site.{name}")
    assert missing == [], f"admin actions without @admin.action(permissions=[...]): {missing}"


def test_a_requeued_dead_letter_stays_its_callers_and_the_cli_marks_its_own(plain_type):
    import io

    from django.core.management import call_command

    from api.models import ServiceToken
    from tasks import dead_letters, owners
    from tasks.models import DeadLetter

    a, b = _two(plain_type)
    token_id = ServiceToken.objects.get(prefix=a.token[4:16]).pk
    dead_id = owners.task_id_prefix(token_id) + unique("dead")
    row = DeadLetter.objects.create(task_id=dead_id, task_type=plain_type, lane="t-tenants", payload={"n": 1},
                                    reason="expired", attempts=1)
    new_id = dead_letters.requeue(row, actor="test")
    assert owners.owns(token_id, new_id)
    assert a.get(f"/tasks/{new_id}").status_code == 200 and b.get(f"/tasks/{new_id}").status_code == 404

    out = io.StringIO()
    call_command("dispatch", plain_type, "--payload", "{}", stdout=out)
    assert owners.owner_of(json.loads(out.getvalue())["task_id"]) == "cli"


# --- hardening -------------------------------------------------------------------------------------------

def test_audit_rows_are_kept_the_configured_days_and_beat_purges_them(plain_type):
    from datetime import timedelta

    from celery import current_app
    from django.conf import settings
    from django.test import override_settings
    from django.utils import timezone

    from api.maintenance import purge_audit
    from api.models import DispatchAudit

    a, _ = _two(plain_type)
    for _ in range(3):
        _send(a, plain_type)
    rows = list(DispatchAudit.objects.filter(task_type=plain_type).order_by("pk"))
    DispatchAudit.objects.filter(pk__in=[rows[0].pk, rows[1].pk]).update(created_at=timezone.now() - timedelta(days=8))
    with override_settings(DISPATCH_API_AUDIT_RETENTION_DAYS=7):
        assert purge_audit(batch_size=1) >= 2
    assert list(DispatchAudit.objects.filter(task_type=plain_type)) == [rows[2]]
    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "api.purge_audit")
    assert entry["task"] in current_app.tasks


def test_shared_and_max_delay_travel_through_config_as_code():
    from tasks.config_io import apply_config, export_config
    from tasks.models import TaskType

    name = unique("ten-cfg")
    define(name, handler="demo.echo", lane="t-tenants")
    exported = next(t for t in export_config()["task_types"] if t["name"] == name)
    assert (exported["shared"], exported["max_delay"]) == (False, None)
    apply_config({"task_types": [{**exported, "shared": True, "max_delay": 12.5}]})
    row = TaskType.objects.get(name=name)
    assert (row.shared, row.max_delay) == (True, 12.5)
