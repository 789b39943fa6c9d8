"""Config as code: apply_config is all-or-nothing and names the bad entry; export round-trips."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from lanes.models import Lane
from tasks.config_io import apply_config, export_config
from tasks.errors import ConfigError
from tasks.models import RetryPolicy, TaskType
from tests.support.helpers import unique


def config(prefix: str, **type_overrides) -> dict:
    return {
        "retry_policies": [{"name": f"{prefix}-p", "max_retries": 2, "initial_backoff": 0.1, "multiplier": 2.0,
                            "max_backoff": 1.0, "jitter": 0.1}],
        "lanes": [{"name": f"{prefix}-lane", "capacity": 100, "accepting": True}],
        "task_types": [{"name": f"{prefix}.echo", "handler": "demo.echo", "lane": f"{prefix}-lane",
                        "retry_policy": f"{prefix}-p", "priority": 3, "timeout": 30, "attempt_timeout": 5,
                        **type_overrides}],
    }


def test_apply_then_export_round_trips():
    prefix = unique("cfg")
    counts = apply_config(config(prefix, chat_scoped=True, chat_queue_size=7))
    assert counts == {"retry_policies": 1, "lanes": 1, "task_types": 1}
    exported = export_config()
    tt = next(t for t in exported["task_types"] if t["name"] == f"{prefix}.echo")
    assert tt["lane"] == f"{prefix}-lane" and tt["chat_queue_size"] == 7 and tt["priority"] == 3
    # Upsert: applying again with a change updates in place.
    apply_config(config(prefix, priority=9))
    assert TaskType.objects.get(name=f"{prefix}.echo").priority == 9
    assert TaskType.objects.filter(name=f"{prefix}.echo").count() == 1


@pytest.mark.parametrize("override, named", [
    ({"handler": "os.system"}, "handler"),
    ({"priority": 11}, "priority"),
    ({"timeout": 0}, "timeout"),
    ({"lane": "no-such-lane"}, "lane 'no-such-lane' does not exist"),
    ({"surprise": 1}, "unknown field(s) surprise"),
    ({"handler": "http.post", "options": {"url": "http://example.com/x"}}, "not allowed"),
])
def test_a_bad_entry_is_named_and_nothing_is_written(override, named):
    prefix = unique("bad")
    data = config(prefix, **override)
    with pytest.raises(ConfigError) as err:
        apply_config(data)
    assert f"task_types[0] '{prefix}.echo'" in str(err.value) and named in str(err.value)
    assert not RetryPolicy.objects.filter(name=f"{prefix}-p").exists()  # all or nothing
    assert not Lane.objects.filter(name=f"{prefix}-lane").exists()


def test_command_reports_errors_and_bad_json(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{not json")
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("apply_config", str(path))
    path.write_text(json.dumps({"lanes": [{"name": "bad:name"}]}))
    with pytest.raises(CommandError, match=r"lanes\[0\] 'bad:name': name"):
        call_command("apply_config", str(path))
    with pytest.raises(CommandError, match="cannot read"):
        call_command("apply_config", str(tmp_path / "missing.json"))


def test_default_config_is_valid():
    from tasks.management.commands.bootstrap import DEFAULT_CONFIG

    apply_config(json.loads(DEFAULT_CONFIG.read_text()))
    assert TaskType.objects.get(name="chat.send").chat_scoped


def test_limits_section_round_trips_in_order_and_names_a_bad_entry():
    from tasks.models import Limit

    prefix = unique("cfl")
    data = config(prefix, limits=[f"{prefix}-chat", f"{prefix}-all"])
    data["limits"] = [{"name": f"{prefix}-all", "scope": "global", "rate": 30, "burst": 30},
                      {"name": f"{prefix}-chat", "scope": "chat", "rate": 1, "burst": 3}]
    assert apply_config(data)["limits"] == 2
    exported = export_config()
    tt = next(t for t in exported["task_types"] if t["name"] == f"{prefix}.echo")
    assert tt["limits"] == [f"{prefix}-chat", f"{prefix}-all"]  # the type's order, not the names'
    assert {x["name"] for x in exported["limits"]} >= {f"{prefix}-all", f"{prefix}-chat"}
    bad = config(prefix, limits=["nope"])
    with pytest.raises(ConfigError, match=r"task_types\[0\] .*limits: 'nope' does not exist"):
        apply_config(bad)
    with pytest.raises(ConfigError, match=r"limits\[0\] .*scope"):
        apply_config({"limits": [{"name": f"{prefix}-fs", "scope": "global", "fair_share": True}]})
    assert not Limit.objects.filter(name=f"{prefix}-fs").exists()  # all or nothing
