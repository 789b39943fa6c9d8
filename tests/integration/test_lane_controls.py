"""Lane controls with real workers: pause/resume (Celery remote control), close/open, drain."""

from __future__ import annotations

import io
import os
import pwd
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from lanes import keys
from lanes.models import LaneEvent
from ops import control
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, unique, wait_until


def _started(rc, lane: str, ttype: str) -> int:
    return int(rc.hget(keys.METRICS_TOTAL, f"started|{lane}|{ttype}") or 0)


def _consumers(lane: str, workers) -> list[str]:
    """Which of the test's ``workers`` consume ``lane``, once every one of them answered (asked by name:
    ``control.consuming_workers`` asks everyone, and would wait for a killed worker whose beat lives on)."""
    from celery import current_app

    names = [f"{w.name}@{_hostname()}" for w in workers]
    replies = current_app.control.inspect(destination=names, timeout=10, limit=len(names)).active_queues() or {}
    assert sorted(replies) == sorted(names), replies
    return sorted(w for w, queues in replies.items() if any(q.get("name") == lane for q in queues or []))


def test_paused_lane_keeps_its_tasks_until_resumed(rc, start_worker):
    lane, other = unique("pz"), unique("pz-other")
    name = unique("pz-echo")
    define(name, lane=lane)
    worker = start_worker(lane, concurrency=2)
    bystander = start_worker(other, concurrency=1)
    assert dispatch.delay(name, {"warm": 1}).get(timeout=30) == {"warm": 1}

    outcome = control.pause(lane, "tester")
    assert outcome.workers == [f"{worker.name}@{_hostname()}"]
    assert _consumers(lane, [worker, bystander]) == []
    results = [dispatch.delay(name, {"i": i}) for i in range(5)]
    dispatched_at = time.monotonic()
    assert all(r.accepted for r in results)

    # A worker started during the pause skips the lane too, and is resumed with the others.
    # Its start overlaps the first wait: 2 s after the dispatch a consuming worker would have taken
    # them, 1.5 s after its start the late one would have (neither count can go back up).
    late = start_worker(lane, concurrency=1)
    time.sleep(max(0.0, dispatched_at + 2.0 - time.monotonic(), 1.5))
    assert lane_depth(rc, lane) == 5 and _started(rc, lane, name) == 1
    assert "lane_paused_at_start" in late.log_text()

    from ops.metrics import snapshot

    row = next(r for r in snapshot(lane_names=[lane])["lanes"] if r["name"] == lane)
    assert row["consuming"] == "paused" and row["depth"] == 5

    resumed = control.resume(lane, "tester")
    assert sorted(resumed.workers) == sorted(f"{w.name}@{_hostname()}" for w in (worker, late))
    assert [r.get(timeout=30) for r in results] == [{"i": i} for i in range(5)]
    assert lane_depth(rc, lane) == 0
    consuming = _consumers(lane, [worker, bystander, late])
    assert consuming == sorted(resumed.workers)
    assert f"{bystander.name}@{_hostname()}" not in consuming  # resume adds no lane to other workers
    assert not rc.sismember(keys.PAUSED_LANES, lane) and not rc.exists(keys.paused_workers(lane))
    actions = list(LaneEvent.objects.filter(lane=lane).order_by("created").values_list("action", "actor"))
    assert actions == [("pause", "tester"), ("resume", "tester")]


def _hostname() -> str:
    import socket

    return socket.gethostname()


def test_consuming_workers_stops_once_every_live_worker_answered(rc, start_worker):
    """The broadcast knows who will answer from the heartbeats: it returns when they all did, instead of
    waiting out its timeout (2 s a pause in the admin, 60 s here)."""
    from celery import current_app

    from lanes.consumers import read_workers

    lane, other = unique("cw"), unique("cw-other")
    pair = start_worker.many(2, lane, concurrency=1)
    bystander = start_worker(other, concurrency=1)

    def every_live_worker_answers() -> bool:  # a worker another test killed has its beat expire (10 s)
        live = sorted({beat.hostname for beat in read_workers(rc, time.time())})
        replies = current_app.control.inspect(destination=live, timeout=1, limit=len(live)).ping() or {}
        return sorted(replies) == live

    wait_until(every_live_worker_answers, timeout=30)
    started = time.monotonic()
    consuming = control.consuming_workers(lane, timeout=60)
    assert time.monotonic() - started < 30  # the old broadcast took the whole 60 s
    assert consuming == sorted(f"{w.name}@{_hostname()}" for w in pair)
    assert f"{bystander.name}@{_hostname()}" not in consuming


def test_close_and_open_from_the_command_line(monkeypatch):
    lane, name = unique("cl"), unique("cl-echo")
    define(name, lane=lane)
    monkeypatch.setenv("USER", "operator7")
    monkeypatch.setenv("LOGNAME", "operator7")
    out = io.StringIO()
    call_command("lanes", "--close", lane, stdout=out)
    assert "refuses new tasks" in out.getvalue()
    rejected = dispatch.delay(name, {})
    assert not rejected.accepted and rejected.reason == "lane_closed"
    call_command("lanes", "--open", lane, stdout=io.StringIO())
    assert dispatch.delay(name, {}).accepted
    events = list(LaneEvent.objects.filter(lane=lane).order_by("created").values_list("action", "actor"))
    # The OS user running the command, not $USER / $LOGNAME, which any caller can set.
    me = f"shell:{pwd.getpwuid(os.getuid()).pw_name}"
    assert me != "shell:operator7"
    assert events == [("close", me), ("open", me)]
    with pytest.raises(CommandError, match="no lane named"):
        call_command("lanes", "--close", unique("nope"), stdout=io.StringIO())


def test_drain_waits_for_the_lane_and_its_retries(rc, start_worker):
    lane = unique("dr")
    slow, flaky = unique("dr-slow"), unique("dr-flaky")
    define(slow, lane=lane)
    define(flaky, handler="demo.flaky", lane=lane, policy={"initial_backoff": 0.05, "jitter": 0})
    results = [dispatch.delay(slow, {"sleep": 0.4, "i": i}) for i in range(4)]
    results.append(dispatch.delay(flaky, {"fail": "retry", "fail_times": 1, "retry_after": 1.0}))
    start_worker(lane, concurrency=1)
    out = io.StringIO()
    call_command("lanes", "--drain", lane, "--timeout", "60", stdout=out)
    text = out.getvalue()
    assert f"draining {lane}:" in text and "drained" in text
    assert "left" in text.splitlines()[0] and int(text.splitlines()[0].split(":")[1].split()[0]) > 0
    # Everything, the retried task included, finished before the drain returned.
    assert all(r.async_result().ready() for r in results)
    assert lane_depth(rc, lane) == 0 and rc.zcard(keys.lane_delayed(lane)) == 0
    assert not dispatch.delay(slow, {}).accepted  # a drained lane stays closed until opened
    actions = list(LaneEvent.objects.filter(lane=lane).order_by("created").values_list("action", flat=True))
    assert actions == ["drain", "drained"]
    call_command("lanes", "--open", lane, stdout=io.StringIO())
    assert not rc.sismember(keys.DRAINING_LANES, lane)


def test_drain_gives_up_after_its_timeout_and_says_what_is_left():
    lane, name = unique("dr-stuck"), unique("dr-stuck-echo")
    define(name, lane=lane)
    assert dispatch.delay(name, {}).accepted  # no worker serves this lane
    with pytest.raises(CommandError, match="still holds 1 task"):
        call_command("lanes", "--drain", lane, "--timeout", "1", stdout=io.StringIO())
    wait_until(lambda: LaneEvent.objects.filter(lane=lane, action="drain").exists())
