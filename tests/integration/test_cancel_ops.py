"""Cancel for operators: the admin's task search and lane purge (permissions, typed confirmation),
the dashboard's links and counter, ``/metrics``, and ``manage.py cancel``'s exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django_celery_results.models import TaskResult

from lanes import keys
from lanes.models import LaneEvent
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, unique

ROOT = Path(__file__).resolve().parents[2]


def staff(*perms: str) -> Client:
    user = get_user_model().objects.create_user(unique("staff"), password="pw-staff-123", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    client = Client()
    client.force_login(user)
    return client


def state(rc, task_id: str, chat: str | None = None) -> bytes | None:
    return rc.hget(keys.task_record(task_id, chat), "st")


def test_search_and_cancel_need_the_cancel_permission(rc):
    name, lane = unique("so"), unique("lso")
    define(name, lane=lane)
    r = dispatch.delay(name, {"n": 1})
    plain = staff("lanes.control_lane")
    assert plain.get("/admin/dashboard/tasks/", {"q": r.task_id}).status_code == 403
    assert plain.post("/admin/dashboard/tasks/", {"task_id": r.task_id}).status_code == 403
    assert state(rc, r.task_id) == b"queued"
    assert Client().get("/admin/dashboard/tasks/").status_code == 302  # logged out: to the login page


def test_search_by_task_chat_and_key_then_cancel(rc):
    name, lane, chat = unique("so"), unique("lso"), unique("chat<b>")
    define(name, lane=lane, chat_scoped=True)
    ids = [dispatch.delay(name, {"n": i}, chat_id=chat, idempotency_key=f"k{i}").task_id for i in range(3)]
    op = staff("lanes.cancel_task")
    page = op.get("/admin/dashboard/tasks/", {"kind": "task", "q": ids[1]})
    assert page.status_code == 200 and ids[1] in page.content.decode() and b"cancel-button" in page.content
    page = op.get("/admin/dashboard/tasks/", {"kind": "chat", "q": chat}).content.decode()
    assert all(t in page for t in ids) and "chat&lt;b&gt;" in page and "chat<b>" not in page  # escaped
    page = op.get("/admin/dashboard/tasks/", {"kind": "key", "type": name, "q": "k2"}).content.decode()
    assert ids[2] in page
    assert b"search-empty" in op.get("/admin/dashboard/tasks/", {"q": "no-such-task"}).content
    done = op.post("/admin/dashboard/tasks/", {"task_id": ids[1], "reason": "user deleted"}, follow=True)
    assert done.status_code == 200 and b"cancelled" in done.content
    assert not rc.exists(keys.task_record(ids[1], chat))
    row = TaskResult.objects.get(task_id=ids[1])
    assert row.status == "REVOKED" and "user deleted" in row.result and "admin:" in row.result
    done = op.post("/admin/dashboard/tasks/", {"chat": chat, "reason": "chat closed"}, follow=True)
    assert b"2 cancelled" in done.content
    assert not rc.exists(keys.chat_queue(chat)) and lane_depth(rc, lane) == 0


def test_dashboard_links_top_chats_to_the_cancel_page_and_counts_cancellations(rc):
    name, lane, chat = unique("so"), unique("lso"), unique("chat")
    define(name, lane=lane, chat_scoped=True)
    for i in range(40):  # a long backlog: this chat is among the top ones
        dispatch.delay(name, {"n": i}, chat_id=chat)
    viewer, op = staff(), staff("lanes.cancel_task", "lanes.control_lane")
    assert b"cancel-chat-link" not in viewer.get("/admin/dashboard/").content
    page = op.get("/admin/dashboard/").content.decode()
    assert "cancel-chat-link" in page and f"q={chat}" in page and f"/admin/dashboard/lanes/{lane}/purge/" in page
    assert len(dispatch.cancel_chat(chat)) == 40
    data = op.get("/admin/dashboard/data/").json()["data"]
    counts = next(x for x in data["lanes"] if x["name"] == lane)["stats"]["counts_15m"]
    assert counts["cancelled"] == 40
    metrics = op.get("/metrics").content.decode()
    assert f'dispatch_tasks_total{{lane="{lane}",outcome="cancelled",type="{name}"}} 40.0' in metrics


def test_lane_purge_needs_lane_control_and_the_typed_name(rc):
    name, lane = unique("sp"), unique("lsp")
    define(name, lane=lane)
    for i in range(5):
        dispatch.delay(name, {"n": i})
    url = f"/admin/dashboard/lanes/{lane}/purge/"
    assert staff("lanes.cancel_task").get(url).status_code == 403
    assert staff("lanes.cancel_task").post(url, {"confirm": lane}).status_code == 403
    op = staff("lanes.control_lane")
    assert op.get(url).status_code == 200
    wrong = op.post(url, {"confirm": lane + "x"})
    assert wrong.status_code == 400 and b"purge-error" in wrong.content and lane_depth(rc, lane) == 5
    done = op.post(url, {"confirm": lane, "reason": "bad batch"})
    assert done.status_code == 302 and lane_depth(rc, lane) == 0
    event = LaneEvent.objects.filter(lane=lane, action="purge").get()
    assert "cancelled 5" in event.detail


def manage(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "cancel", *args], cwd=ROOT, env=os.environ.copy(),
                          capture_output=True, text=True, timeout=120, input=stdin)


def test_cli_exit_codes(rc):
    name, lane, chat = unique("sc"), unique("lsc"), unique("chat")
    define(name, lane=lane, chat_scoped=True)
    ids = [dispatch.delay(name, {"n": i}, chat_id=chat).task_id for i in range(4)]
    done = manage(ids[0], "--reason", "cli", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["outcome"] == "cancelled"
    assert "shell:" in TaskResult.objects.get(task_id=ids[0]).result
    again = manage(ids[0], "--json")
    assert again.returncode == 0 and json.loads(again.stdout)[0]["outcome"] == "already_cancelled"
    assert manage("0b8f2f4e-0000-4000-8000-000000000000").returncode == 1  # unknown: nothing to cancel
    assert manage().returncode == 2 and manage(ids[1], "--chat", chat).returncode == 2
    assert manage("a:b").returncode == 2
    assert manage("--chat", chat).returncode == 0 and not rc.exists(keys.chat_queue(chat))
    # A lane purge: refused without a confirmation, done with --yes.
    for i in range(3):
        dispatch.delay(name, {"n": i}, chat_id=unique("chat"))
    assert manage("--lane", lane).returncode == 2  # --queued is required
    assert manage("--lane", lane, "--queued", stdin="").returncode == 2 and lane_depth(rc, lane) == 3
    assert manage("--lane", unique("nolane"), "--queued", "--yes").returncode == 2
    done = manage("--lane", lane, "--queued", "--yes", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["counts"] == {"cancelled": 3}
    assert lane_depth(rc, lane) == 0
