"""The measuring tools are their own app: installed by default, out of the production profile (issue 14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchsite.settings import tools_installed

ROOT = Path(__file__).resolve().parents[2]

PROBE = ("import django, json; django.setup(); from django.apps import apps; from tasks import registry; "
         "from django.core.management import get_commands; "
         "print(json.dumps([apps.is_installed('tools'), 'loadtest.sink' in registry.handler_names(), "
         "'loadtest' in get_commands(), 'benchmark' in get_commands()]))")


@pytest.mark.parametrize(("env", "installed"), [
    ({}, True),
    ({"DISPATCH_PROFILE": "production"}, False),
    ({"DISPATCH_PROFILE": "production", "DISPATCH_TOOLS": "1"}, True),
    ({"DISPATCH_TOOLS": "0"}, False),
    ({"DISPATCH_TOOLS": ""}, True),
])
def test_tools_are_in_unless_the_production_profile_and_the_switch_wins(env, installed):
    assert tools_installed(env) is installed


def _probe(**env: str) -> list[bool]:
    clean = {k: v for k, v in os.environ.items() if k not in ("DISPATCH_PROFILE", "DISPATCH_TOOLS")}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**clean, "DJANGO_SETTINGS_MODULE": "dispatchsite.settings", **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_production_process_has_no_sink_handler_and_no_tool_commands():
    assert _probe(DISPATCH_PROFILE="production") == [False, False, False, False]
    assert _probe(DISPATCH_PROFILE="production", DISPATCH_TOOLS="1") == [True, True, True, True]


def test_a_default_process_has_the_sink_handler_and_the_tool_commands():
    assert _probe() == [True, True, True, True]


def test_the_default_config_skips_the_sink_type_when_its_handler_is_not_registered():
    from tasks.config_io import default_config_for
    from tasks.management.commands.bootstrap import DEFAULT_CONFIG

    data = json.loads(DEFAULT_CONFIG.read_text())
    without = default_config_for(data, "", handlers=["demo.echo", "http.post"])
    assert without["task_types"] and not any(t["handler"] == "loadtest.sink" for t in without["task_types"])
    assert default_config_for(data, "", handlers=["demo.echo", "http.post", "loadtest.sink"]) == data
