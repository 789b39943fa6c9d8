"""Limits in the admin: the Limit form's checks, and a task type's limits in order."""

from __future__ import annotations

import json

from tasks.models import Limit, TaskType
from tests.support.helpers import define, unique


def _type_form(tt: TaskType, **fields) -> dict:
    return {"name": tt.name, "handler": "demo.echo", "lane": tt.lane_id, "priority": 5, "enabled": "on",
            "options": json.dumps({}), "timeout": 60, "attempt_timeout": 10, "retry_policy": tt.retry_policy_id,
            "chat_queue_size": 64, "max_payload_bytes": 65536, "idempotency_window": 86400, **fields}


def test_limit_form_checks_and_a_type_keeps_its_limits_in_order(admin_client):
    bad = admin_client.post("/admin/tasks/limit/add/", {"name": "x:y", "scope": "global", "rate": "5"})
    assert bad.status_code == 200 and b"no &#x27;:&#x27;" in bad.content
    nothing = admin_client.post("/admin/tasks/limit/add/", {"name": unique("l"), "scope": "global"})
    assert b"would limit nothing" in nothing.content
    names = [unique("la"), unique("lb")]
    for name in names:
        assert admin_client.post("/admin/tasks/limit/add/", {
            "name": name, "scope": "key", "max_in_flight": "2", "weights": "{}"}).status_code == 302
    tt = define(unique("ty"))
    url = f"/admin/tasks/tasktype/{tt.pk}/change/"
    assert admin_client.post(url, _type_form(tt, limit_names=f"{names[1]}, {names[0]}")).status_code == 302
    assert tt.limit_names() == [names[1], names[0]]
    page = admin_client.get(url).content.decode()
    assert f"{names[1]}, {names[0]}" in page
    refused = admin_client.post(url, _type_form(tt, limit_names="no-such-limit"))
    assert refused.status_code == 200 and b"No limit named" in refused.content
    assert tt.limit_names() == [names[1], names[0]]
    assert Limit.objects.get(name=names[0]).type_rows.count() == 1
