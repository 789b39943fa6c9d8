"""Exit codes and messages of ``manage.py dispatch`` / ``deadletters`` a script can trust.

Each command runs as a real process (``manage.py`` in a subprocess, with the test
session's Redis and database) against a real worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import define, unique

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=os.environ.copy(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def types(lane_worker):
    echo, flaky = unique("cli-echo"), unique("cli-flaky")
    define(echo, handler="demo.echo", lane="t-default")
    define(flaky, handler="demo.flaky", lane="t-default", policy={"max_retries": 0})
    return {"echo": echo, "flaky": flaky}


def test_success_exits_0(types):
    done = manage("dispatch", types["echo"], "--payload", '{"n": 1}', "--wait", "--wait-timeout", "60")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["state"] == "SUCCESS" and out["result"] == {"n": 1}


def test_rejection_exits_1_with_the_reason():
    done = manage("dispatch", unique("no-such-type"), "--payload", "{}")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["reason"] == "unknown_type"


@pytest.mark.parametrize("arg", ["--payload", "--metadata"])
def test_bad_json_is_a_usage_error_naming_the_argument(types, arg):
    args = ["--payload", "{}", "--metadata", "{}"]
    args[args.index(arg) + 1] = "{not json"
    done = manage("dispatch", types["echo"], *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"{arg} is not valid JSON" in done.stderr
    other = "--metadata" if arg == "--payload" else "--payload"
    assert other not in done.stderr


def test_dead_lettered_task_exits_3(types):
    done = manage("dispatch", types["flaky"], "--payload", '{"fail": "fatal"}', "--wait", "--wait-timeout", "60")
    assert done.returncode == 3, (done.stdout, done.stderr)
    out = json.loads(done.stdout)
    assert out["state"] == "FAILURE" and "non_retryable" in out["error"]


def test_wait_timeout_exits_4_saying_the_task_runs(types):
    """Past --wait-timeout a running task has no result row: the record says it runs (not PENDING)."""
    done = manage("dispatch", types["echo"], "--payload", '{"sleep": 7}', "--wait", "--wait-timeout", "4")
    assert done.returncode == 4, (done.stdout, done.stderr)
    out = json.loads(done.stdout)
    assert out["state"] == "STARTED" and out["record_state"] == "running", out
    assert "TimeoutError" in out["error"] and "wait_error" not in out, out


def test_limit_key_is_an_option(types):
    from tasks import config
    from tasks.models import Limit, TaskType, TaskTypeLimit

    name = unique("cli-keyed")
    tt = define(name, handler="demo.echo", lane="t-default")
    limit = Limit(name=unique("cli-supplier"), scope="key", rate=100, burst=100)
    limit.full_clean()
    limit.save()
    TaskTypeLimit.objects.create(task_type=TaskType.objects.get(pk=tt.pk), limit=limit, position=0)
    config.forget()
    missing = manage("dispatch", name, "--payload", "{}")
    assert missing.returncode == 1 and json.loads(missing.stdout)["reason"] == "invalid_limit_key", missing.stdout
    done = manage("dispatch", name, "--payload", '{"n": 2}', "--limit-key", "supplier-3", "--wait")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert json.loads(done.stdout)["result"] == {"n": 2}


def test_help_documents_the_exit_codes():
    done = manage("dispatch", "--help")
    assert done.returncode == 0
    for line in ("0  ", "1  ", "2  ", "3  ", "4  ", "5  "):
        assert f"\n  {line}" in done.stdout, done.stdout


@pytest.mark.parametrize(("option", "allowed"), [("--reason", "exhausted"), ("--status", "requeued")])
def test_deadletters_rejects_unknown_filter_values(option, allowed):
    done = manage("deadletters", option, "nonsense")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "nonsense" in done.stderr and allowed in done.stderr
    assert "(none)" not in done.stdout


def test_deadletters_unknown_lane_or_type_names_the_known_ones(types):
    done = manage("deadletters", "--type", "nonsense-type")
    assert done.returncode == 2, (done.stdout, done.stderr)
    # The list of known names is cut after a few (other tests add types to the same database).
    assert "nonsense-type" in done.stderr and "known:" in done.stderr
    done = manage("deadletters", "--lane", "nonsense-lane")
    assert done.returncode == 2 and "nonsense-lane" in done.stderr and "known:" in done.stderr


def test_result_get_raises_dead_lettered_and_celery_timeout(types):
    from celery.exceptions import TimeoutError as CeleryTimeoutError

    from tasks.dispatch import dispatch
    from tasks.errors import DeadLettered

    dead = dispatch.delay(types["flaky"], {"fail": "fatal"})
    with pytest.raises(DeadLettered, match="non_retryable"):
        dead.get(timeout=60)
    slow = dispatch.delay(types["echo"], {"sleep": 2})
    with pytest.raises(CeleryTimeoutError):
        slow.get(timeout=0.3)
