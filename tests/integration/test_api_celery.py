"""The send-by-name path for a service that does not import the project (issue 13).

A separate Python process that imports only ``celery`` sends ``tasks.dispatch``
with no queue option (Celery's default queue ``celery``) and with
``queue="ingress"``; a real ingress worker (consuming ``ingress,celery``, as
``make run``'s default group does) admits it and a lane worker runs it. The
caller cannot ``.get()`` (no result backend it can read): it follows the
message id through the HTTP API to the DispatchResult, then to the task.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.api_client import ApiClient, make_token
from tests.support.helpers import define, unique, wait_until

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "bare_celery_client.py"


def _send_bare(broker: str, task_type: str, payload: dict, tmp_path: Path, queue: str | None = None) -> str:
    args = [sys.executable, "-I", str(SCRIPT), broker, task_type, json.dumps(payload), *([queue] if queue else [])]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    sent = json.loads(out.stdout.strip().splitlines()[-1])
    assert sent["leaked"] == [], f"the bare client imported project modules: {sent['leaked']}"
    return sent["id"]


def _succeeded(api, task_id: str) -> dict | None:
    """The task's state once SUCCESS. Until the ingress worker has written its first row, a bare client's
    message id is no task the API knows: 404 ``unknown_task`` (CI: a first poll came before the row)."""
    response = api.get(f"/tasks/{task_id}")
    if response.status_code == 404:
        assert json.loads(response.content)["reason"] == "unknown_task", response.content
        return None
    state = json.loads(response.content)
    return state if state["state"] == "SUCCESS" else None


@pytest.mark.parametrize("queue", [None, "ingress"], ids=["default-queue", "queue-ingress"])
def test_bare_celery_client_reaches_admission(redis_server, lane_worker, start_worker, tmp_path, queue):
    name = unique("bare")
    define(name, handler="demo.echo")
    api = ApiClient(make_token(unique("svc"), [name], reads_broker_tasks=True))
    start_worker("ingress,celery", concurrency=1)

    message_id = _send_bare(redis_server.url, name, {"from": "bare", "q": queue or "celery"}, tmp_path, queue)

    outer = wait_until(lambda: _succeeded(api, message_id), timeout=45,
                       what="the ingress worker to admit the bare client's message")
    assert outer["task_name"] == "tasks.dispatch"
    reply = outer["result"]
    assert reply["accepted"] is True and reply["priority"] == 6 and reply["queue"] == "t-default"
    assert outer["dispatched_task_id"] == reply["task_id"]

    inner = wait_until(lambda: _succeeded(api, reply["task_id"]), timeout=45, what="the admitted task to run")
    assert inner["result"] == {"from": "bare", "q": queue or "celery"} and inner["task_name"] == name
