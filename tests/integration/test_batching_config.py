"""Batched types in configuration: the registry's flag, the type's batch fields in config as code and the admin."""

from __future__ import annotations

import pytest

from tasks import registry
from tasks.config_io import apply_config, export_config
from tasks.errors import ConfigError
from tasks.models import TaskType
from tests.integration.test_config_io import config
from tests.support.helpers import unique


def test_the_registry_knows_which_handlers_are_batched():
    assert registry.get("demo.echo_batch").batch and registry.get("http.post_batch").batch
    assert not registry.get("demo.echo").batch
    assert registry.task("demo.echo_batch").batched and not registry.task("demo.echo").batched


def test_batch_fields_round_trip_through_config_as_code():
    prefix = unique("cfgb")
    apply_config(config(prefix, handler="demo.echo_batch", batch_size=250, batch_window_ms=8))
    tt = TaskType.objects.get(name=f"{prefix}.echo")
    assert (tt.batch_size, tt.batch_window_ms) == (250, 8)
    exported = next(t for t in export_config()["task_types"] if t["name"] == f"{prefix}.echo")
    assert (exported["batch_size"], exported["batch_window_ms"]) == (250, 8)


@pytest.mark.parametrize("override, named", [
    ({"batch_size": 0}, "batch_size: Batch size must be between 1 and 1000"),
    ({"batch_size": 1001}, "batch_size: Batch size must be between 1 and 1000"),
    ({"batch_window_ms": 1001}, "batch_window_ms: Batch window must be between 0 and 1000 ms"),
    ({"batch_size": "many"}, "batch_size: “many” value must be an integer"),
])
def test_a_bad_batch_field_is_named(override, named):
    prefix = unique("badb")
    with pytest.raises(ConfigError) as err:
        apply_config(config(prefix, handler="demo.echo_batch", **override))
    assert f"task_types[0] '{prefix}.echo'" in str(err.value) and named in str(err.value), str(err.value)


def test_the_admin_form_refuses_a_batch_size_out_of_range(admin_client):
    from lanes.models import Lane
    from tasks.models import RetryPolicy

    lane = Lane.objects.create(name=unique("adl"), capacity=10)
    policy = RetryPolicy.objects.create(name=unique("adp"))
    name = unique("adb")
    form = {"name": name, "handler": "demo.echo_batch", "lane": lane.pk, "priority": 5, "enabled": "on",
            "options": "{}", "limit_names": "", "timeout": 300, "attempt_timeout": 30, "retry_policy": policy.pk,
            "chat_queue_size": 64, "max_payload_bytes": 65536, "idempotency_window": 86400,
            "batch_size": 5000, "batch_window_ms": 5}
    response = admin_client.post("/admin/tasks/tasktype/add/", form)
    assert response.status_code == 200 and b"Batch size must be between 1 and 1000" in response.content
    assert not TaskType.objects.filter(name=name).exists()
    form["batch_size"] = 64
    response = admin_client.post("/admin/tasks/tasktype/add/", form)
    assert response.status_code == 302, response.content[:2000]
    assert TaskType.objects.get(name=name).batch_size == 64


def test_manage_py_lanes_lists_batched_types():
    import json
    from io import StringIO

    from django.core.management import call_command

    prefix = unique("lsb")
    apply_config(config(prefix, handler="demo.echo_batch", batch_size=64, batch_window_ms=7))
    out = StringIO()
    call_command("lanes", "--lane", f"{prefix}-lane", stdout=out)
    assert f"{prefix}.echo@{prefix}-lane 64/7ms" in out.getvalue()
    out = StringIO()
    call_command("lanes", "--json", "--lane", f"{prefix}-lane", stdout=out)
    listed = json.loads(out.getvalue())["batched_types"]
    assert [(t["name"], t["batch_size"], t["batch_window_ms"]) for t in listed] == [(f"{prefix}.echo", 64, 7)]
