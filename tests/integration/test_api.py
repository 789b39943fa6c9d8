"""The HTTP API (api/): auth, scope, validation, bulk, rate limit, audit, task state, JSON-only errors."""

from __future__ import annotations

import json

import pytest

from tests.support.api_client import ApiClient, make_token
from tests.support.helpers import define, unique, wait_until


@pytest.fixture
def echo_type():
    name = unique("api-echo")
    define(name, handler="demo.echo")
    return name


@pytest.fixture
def api(echo_type):
    return ApiClient(make_token(unique("svc"), [echo_type]))


def _body(response) -> dict:
    assert response["Content-Type"].startswith("application/json"), (response.status_code, response.content[:300])
    return json.loads(response.content)


# --- auth and scope -----------------------------------------------------------

def test_missing_token_is_401(echo_type):
    r = ApiClient(None).post("/dispatch", {"task_type": echo_type, "payload": {}})
    assert r.status_code == 401
    body = _body(r)
    assert body["reason"] == "unauthorized" and "missing Authorization" in body["detail"]
    assert r["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("token", ["not-a-token", "dsp_0123456789ab_wrongsecret", "dsp_zz_x"])
def test_wrong_token_is_401(echo_type, api, token):
    r = ApiClient(token).post("/dispatch", {"task_type": echo_type, "payload": {}})
    assert r.status_code == 401 and _body(r)["reason"] == "unauthorized"


def test_right_prefix_wrong_secret_is_401(echo_type, api):
    forged = api.token.rsplit("_", 1)[0] + "_" + "x" * 43
    if forged == api.token:  # the secret itself may contain '_': cut at the fixed prefix instead
        forged = api.token[:17] + "x" * 43
    r = ApiClient(forged).post("/dispatch", {"task_type": echo_type, "payload": {}})
    assert r.status_code == 401 and _body(r)["detail"] == "unknown token"


def test_revoked_token_is_401_and_says_revoked(echo_type):
    from api.models import ServiceToken

    name = unique("svc")
    client = ApiClient(make_token(name, [echo_type]))
    ServiceToken.objects.get(name=name).revoke()
    r = client.post("/dispatch", {"task_type": echo_type, "payload": {}})
    assert r.status_code == 401
    body = _body(r)
    assert body["reason"] == "token_revoked" and "revoked" in body["detail"] and name in body["detail"]


def test_type_out_of_scope_is_403_naming_it(api):
    other = unique("api-other")
    define(other, handler="demo.echo")
    for path, data in (("/dispatch", {"task_type": other, "payload": {}}),
                       ("/dispatch/bulk", {"task_type": other, "items": [{}]})):
        r = api.post(path, data)
        assert r.status_code == 403
        body = _body(r)
        assert body["reason"] == "forbidden_type" and repr(other) in body["detail"]


def test_token_is_stored_hashed_and_last_use_recorded(echo_type, api):
    import hashlib

    from api.models import ServiceToken

    row = ServiceToken.objects.get(prefix=api.token[4:16])
    secret = api.token[17:]
    assert secret not in {row.secret_hash, row.prefix, row.notes}
    assert row.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert row.last_used_at is None
    api.get(f"/tasks/{unique('t')}")
    row.refresh_from_db()
    assert row.last_used_at is not None


# --- dispatch: the DispatchResult contract ------------------------------------

def test_dispatch_accepted_is_202_and_runs(lane_worker, echo_type, api):
    r = api.post("/dispatch", {"task_type": echo_type, "payload": {"hello": 1}, "priority": 7,
                               "idempotency_key": unique("k"), "timeout": 60, "metadata": {"trace": "t1"}})
    assert r.status_code == 202, r.content
    body = _body(r)
    assert body["accepted"] is True and body["priority"] == 7 and body["queue"] == "t-default"
    assert set(body) == {"accepted", "task_id", "queue", "priority", "position", "reason", "detail", "duplicate",
                         "estimated_delay", "replaced"}
    state = wait_until(lambda: (s := _body(api.get(f"/tasks/{body['task_id']}")))["state"] == "SUCCESS" and s,
                       timeout=30, what="the task's SUCCESS")
    assert state["result"] == {"hello": 1} and state["task_name"] == echo_type and state["dead_letter"] is None


def test_duplicate_idempotency_key_is_accepted_with_the_first_id_and_conflict_is_409(echo_type, api):
    key = unique("k")
    first = _body(api.post("/dispatch", {"task_type": echo_type, "payload": {"n": 1}, "idempotency_key": key}))
    again = api.post("/dispatch", {"task_type": echo_type, "payload": {"n": 1}, "idempotency_key": key})
    assert again.status_code == 202 and _body(again)["duplicate"] is True
    assert _body(again)["task_id"] == first["task_id"]
    conflict = api.post("/dispatch", {"task_type": echo_type, "payload": {"n": 2}, "idempotency_key": key})
    assert conflict.status_code == 409 and _body(conflict)["reason"] == "idempotency_conflict"


@pytest.mark.parametrize("field,value,loc", [
    ("priority", "7", "priority"),           # a string is not a priority
    ("priority", True, "priority"),          # nor a boolean
    ("timeout", "60", "timeout"),
    ("chat_id", 42, "chat_id"),
    ("payload", [1, 2], "payload"),
    ("metadata", "trace", "metadata"),
    ("surprise", 1, "surprise"),             # unknown fields are refused
])
def test_wrong_types_and_unknown_fields_are_422_naming_the_field(echo_type, api, field, value, loc):
    r = api.post("/dispatch", {"task_type": echo_type, "payload": {}, field: value})
    assert r.status_code == 422
    body = _body(r)
    assert body["reason"] == "invalid_request"
    assert any(e["loc"][-1] == loc for e in body["detail"]), body


def test_missing_field_and_bad_json_are_named(echo_type, api):
    r = api.post("/dispatch", {"payload": {}})
    assert r.status_code == 422 and _body(r)["detail"][0]["loc"][-1] == "task_type"
    r = api.post("/dispatch", raw="{not json")
    assert r.status_code == 400
    assert _body(r) == {"reason": "invalid_request", "detail": "request body is not valid JSON"}


@pytest.mark.parametrize("extra,reason,status", [
    ({"chat_id": "a\x00b"}, "invalid_chat_id", 422),
    ({"priority": 12}, "invalid_priority", 422),
    ({"timeout": -1}, "invalid_timeout", 422),
    ({"idempotency_key": ""}, "invalid_idempotency_key", 422),
    ({"payload": {"big": "x" * 70000}}, "payload_too_large", 413),
])
def test_admission_rejections_are_clean_json_results(echo_type, api, extra, reason, status):
    r = api.post("/dispatch", {"task_type": echo_type, "payload": {"a": 1}, **extra})
    assert r.status_code == status
    body = _body(r)
    assert body["accepted"] is False and body["reason"] == reason and body["detail"] and body["task_id"] is None


def test_closed_lane_is_503_with_retry_after_and_disabled_type_is_409(api, echo_type):
    from lanes.models import Lane
    from tasks.models import TaskType

    lane = unique("t-closed")
    name = unique("api-closed")
    define(name, handler="demo.echo", lane=lane)
    Lane.objects.filter(name=lane).update(accepting=False)
    from lanes.config_version import bump_config_version

    bump_config_version()
    disabled = unique("api-off")
    define(disabled, handler="demo.echo", enabled=False)
    client = ApiClient(make_token(unique("svc"), [name, disabled]))
    r = client.post("/dispatch", {"task_type": name, "payload": {}})
    assert r.status_code == 503 and _body(r)["reason"] == "lane_closed" and r["Retry-After"] == "1"
    r = client.post("/dispatch", {"task_type": disabled, "payload": {}})
    assert r.status_code == 409 and _body(r)["reason"] == "type_disabled"
    assert TaskType.objects.filter(name=disabled, enabled=False).exists()


def test_body_over_the_limit_is_413(api, echo_type):
    from django.test import override_settings

    with override_settings(DISPATCH_API_MAX_BODY_BYTES=1000):
        r = api.post("/dispatch", {"task_type": echo_type, "payload": {"x": "y" * 2000}})
    assert r.status_code == 413
    body = _body(r)
    assert body["reason"] == "body_too_large" and "at most 1000" in body["detail"]


# --- bulk ---------------------------------------------------------------------

def test_bulk_admits_each_item_on_its_own_in_input_order(lane_worker, api):
    from api.models import DispatchAudit

    chat_type = unique("api-chat")
    define(chat_type, handler="demo.echo", chat_scoped=True)
    client = ApiClient(make_token(unique("svc"), [chat_type]))
    items = [
        {"payload": {"n": 0}, "chat_id": "c1"},
        {"payload": {"n": 1}, "chat_id": "c1", "priority": 42},
        "not an object",
        {"payload": {"n": 3}},                      # chat-scoped type, no chat id
        {"payload": {"n": 4}, "chat_id": "c2", "idempotency_key": unique("k")},
        {"payload": {"n": 5}, "chat_id": "c1"},
    ]
    r = client.post("/dispatch/bulk", {"task_type": chat_type, "items": items, "timeout": 60})
    assert r.status_code == 200, r.content
    body = _body(r)
    got = [(x["accepted"], x["reason"]) for x in body["results"]]
    assert got == [(True, None), (False, "invalid_priority"), (False, "invalid_payload"),
                   (False, "invalid_chat_id"), (True, None), (True, None)]
    assert (body["accepted"], body["rejected"]) == (3, 3)
    ids = [x["task_id"] for x in body["results"] if x["accepted"]]
    for task_id, n in zip(ids, (0, 4, 5), strict=True):
        wait_until(lambda t=task_id: _body(client.get(f"/tasks/{t}"))["state"] == "SUCCESS", timeout=30)
        assert _body(client.get(f"/tasks/{task_id}"))["result"] == {"n": n}

    row = DispatchAudit.objects.filter(task_type=chat_type).get()
    assert (row.endpoint, row.items, row.accepted) == ("bulk", 6, 3)
    assert row.reasons == {"invalid_priority": 1, "invalid_payload": 1, "invalid_chat_id": 1}
    assert row.task_ids == ids and row.remote_addr == "127.0.0.1" and row.token_name.startswith("svc-")


def test_bulk_bare_payloads_and_the_item_limit(api, echo_type):
    r = api.post("/dispatch/bulk", {"task_type": echo_type, "items": [{"a": 1}, {"payload": 1, "other": 2}]})
    assert r.status_code == 200
    assert [x["accepted"] for x in _body(r)["results"]] == [True, True]  # the second is a bare payload
    r = api.post("/dispatch/bulk", {"task_type": echo_type, "items": [{}] * 1001})
    assert r.status_code == 422
    (error,) = _body(r)["detail"]
    assert error["loc"][-1] == "items" and "1000" in error["msg"]
    r = api.post("/dispatch/bulk", {"task_type": echo_type, "items": []})
    assert r.status_code == 422


def test_one_audit_row_per_single_dispatch(api, echo_type):
    from api.models import DispatchAudit

    ok = _body(api.post("/dispatch", {"task_type": echo_type, "payload": {"a": 1}}))
    api.post("/dispatch", {"task_type": echo_type, "payload": {"a": 1}, "priority": 99})
    rows = list(DispatchAudit.objects.filter(task_type=echo_type).order_by("created_at", "pk"))
    assert [(r.endpoint, r.items, r.accepted, r.task_ids, r.reasons) for r in rows] == [
        ("dispatch", 1, 1, [ok["task_id"]], {}), ("dispatch", 1, 0, [], {"invalid_priority": 1})]


# --- rate limit ---------------------------------------------------------------

def test_rate_limit_is_429_with_retry_after(echo_type):
    client = ApiClient(make_token(unique("svc"), [echo_type], rate_per_s=2))
    statuses = []
    for _ in range(40):
        r = client.get(f"/tasks/{unique('t')}")
        statuses.append(r.status_code)
        if r.status_code == 429:
            body = _body(r)
            assert body["reason"] == "rate_limited" and "2 requests/s" in body["detail"]
            assert int(r["Retry-After"]) >= 1
            break
    assert 429 in statuses, statuses
    assert statuses.count(404) >= 2  # the first requests of a window pass (and find no such task)


def test_rate_limit_is_per_token(echo_type):
    """One token over its rate does not hold back another."""
    busy = ApiClient(make_token(unique("svc"), [echo_type], rate_per_s=1))
    other = ApiClient(make_token(unique("svc"), [echo_type], rate_per_s=1000))
    wait_until(lambda: busy.get("/tasks/x").status_code == 429, timeout=10, interval=0)
    assert other.get("/tasks/x").status_code == 404


# --- task state ---------------------------------------------------------------

def test_task_state_unknown_and_dead_letter(api):
    from api import tenancy
    from api.models import ServiceToken
    from tasks.models import DeadLetter

    r = api.get(f"/tasks/{unique('never')}")
    assert r.status_code == 404 and _body(r)["reason"] == "unknown_task"
    token_id = ServiceToken.objects.get(prefix=api.token[4:16]).pk
    task_id = tenancy.task_id_prefix(token_id) + unique("dead")
    DeadLetter.objects.create(task_id=task_id, task_type="x", lane="t-default", reason="expired",
                              error_message="deadline passed", attempts=2)
    body = _body(api.get(f"/tasks/{task_id}"))
    assert body["dead_letter"] == {"reason": "expired", "status": "dead", "error": "deadline passed", "attempts": 2,
                                   "requeued_task_id": ""}
    r = api.get("/tasks/" + "x" * 65)
    assert r.status_code == 422 and _body(r)["reason"] == "invalid_request"


# --- JSON, never HTML ---------------------------------------------------------

def test_unknown_paths_and_methods_answer_json(api):
    for path in ("/api/v1/nope", "/api/v2/dispatch", "/api/"):
        r = api.client.get(path)
        assert r.status_code == 404 and _body(r)["reason"] == "not_found"


# --- the OpenAPI schema -------------------------------------------------------

def test_served_schema_is_the_committed_one_and_valid_openapi_3():
    from pathlib import Path

    from django.test import Client

    r = Client().get("/api/v1/openapi.json")
    assert r.status_code == 200
    served = json.loads(r.content)
    committed = json.loads((Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())
    assert served == committed, "the API changed: run `.venv/bin/python manage.py export_openapi` and commit it"
    assert served["openapi"].startswith("3.")
    assert served["info"]["title"] and served["info"]["version"]
    assert set(served["paths"]) >= {"/api/v1/dispatch", "/api/v1/dispatch/bulk", "/api/v1/tasks/{task_id}"}
    schemas = served["components"]["schemas"]
    for path, operations in served["paths"].items():
        for method, op in operations.items():
            assert method in {"get", "post", "put", "patch", "delete"}, (path, method)
            assert op["responses"], (path, method)
            assert op["security"] == [{"ServiceTokenAuth": []}], (path, method)
            for response in op["responses"].values():
                ref = response["content"]["application/json"]["schema"].get("$ref", "")
                assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, (path, ref)
    assert served["components"]["securitySchemes"]["ServiceTokenAuth"] == {"type": "http", "scheme": "bearer"}


def test_docs_page_is_for_staff_only(admin_client):
    from django.test import Client

    assert Client().get("/api/v1/docs").status_code == 302
    assert admin_client.get("/api/v1/docs").status_code == 200


# --- the admin ----------------------------------------------------------------

def test_admin_creates_a_token_shown_once_and_revokes_it(admin_client, echo_type):
    from django.contrib.messages import get_messages

    from api.models import ServiceToken
    from tasks.models import TaskType

    name = unique("svc-admin")
    tt = TaskType.objects.get(name=echo_type)
    r = admin_client.post("/admin/api/servicetoken/add/",
                          {"name": name, "notes": "team x", "task_types": [tt.pk], "rate_per_s": 50,
                           "lane_share": 100}, follow=True)
    assert r.status_code == 200
    shown = [str(m) for m in get_messages(r.wsgi_request)] or [r.content.decode()]
    text = " ".join(shown)
    row = ServiceToken.objects.get(name=name)
    token = text.split("<code>", 1)[1].split("</code>", 1)[0]
    assert token.startswith(f"dsp_{row.prefix}_") and token[17:] not in row.secret_hash
    client = ApiClient(token)
    assert client.post("/dispatch", {"task_type": echo_type, "payload": {}}).status_code == 202
    page = admin_client.get(f"/admin/api/servicetoken/{row.pk}/change/").content.decode()
    assert token not in page  # shown once, never again

    r = admin_client.post("/admin/api/servicetoken/", {"action": "revoke", "_selected_action": [row.pk]})
    assert r.status_code == 302
    assert client.post("/dispatch", {"task_type": echo_type, "payload": {}}).status_code == 401
    assert admin_client.get("/admin/api/dispatchaudit/").status_code == 200
    assert admin_client.get("/admin/api/dispatchaudit/add/").status_code == 403
