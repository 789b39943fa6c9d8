"""A task's own history and progress, through real workers and a real Redis: the API and the admin's page."""

from __future__ import annotations

import threading
import time

import pytest
from django_celery_results.models import TaskResult

from lanes import keys
from tasks.maintenance import expire_due
from tests.support.api_client import ApiClient, make_token
from tests.support.helpers import define, unique, wait_until

THREADS_LANE = unique("hist-threads")
PREFORK_LANE = unique("hist-prefork")


@pytest.fixture(scope="module")
def workers(tmp_root):
    """A thread-pool worker (the group runner's path) and a prefork one (Celery's request path)."""
    from tests.support.workers import Worker

    started = [Worker(THREADS_LANE, tmp_root / "logs", pool="threads", concurrency=4).start(),
               Worker(PREFORK_LANE, tmp_root / "logs", concurrency=1).start()]
    yield started
    for worker in started:
        worker.discard()


def _api(*types: str) -> ApiClient:
    return ApiClient(make_token(unique("hist-token"), list(types)))


def _dispatch(api: ApiClient, task_type: str, payload: dict, **options) -> str:
    response = api.post("/dispatch", {"task_type": task_type, "payload": payload, **options})
    assert response.status_code == 202, response.json()
    return response.json()["task_id"]


def _state(api: ApiClient, task_id: str, history: bool = False) -> dict:
    response = api.get(f"/tasks/{task_id}" + ("?history=1" if history else ""))
    assert response.status_code == 200, response.json()
    return response.json()


def _done(task_id: str, status: str = "SUCCESS") -> None:
    wait_until(lambda: TaskResult.objects.filter(task_id=task_id, status=status).exists(), timeout=60,
               what=f"{task_id} {status}")


class Monitor:
    """Redis's MONITOR on a connection of its own: the commands that name ``needle``."""

    def __init__(self, rc, needle: str) -> None:
        self.rc, self.needle, self.seen, self.stop = rc, needle, [], False
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _listen(self) -> None:
        with self.rc.monitor() as monitor:
            self.ready.set()
            for entry in monitor.listen():
                if self.stop:
                    return
                if self.needle in entry["command"]:
                    self.seen.append(entry["command"])

    def close(self) -> list[str]:
        self.stop = True
        self.rc.echo("wake the monitor")
        self.thread.join(5)
        return self.seen


def test_progress_shows_the_latest_value_and_is_written_at_most_twice_a_second(workers, rc):
    type_name = unique("hist-progress")
    define(type_name, handler="demo.progress", lane=THREADS_LANE)
    api = _api(type_name)
    key = keys.task_progress("")  # every progress key starts so; the task id is known only after dispatch
    monitor = Monitor(rc, key)
    started = time.monotonic()
    try:
        task_id = _dispatch(api, type_name, {"steps": 10, "sleep": 0.15})
        seen_running = wait_until(lambda: (_state(api, task_id)["progress"] or {}).get("fraction", 1) < 1
                                  and _state(api, task_id)["progress"], timeout=30, what="progress while running")
        _done(task_id)
        final = wait_until(lambda: (p := _state(api, task_id)["progress"]) and p["fraction"] == 1.0 and p,
                           timeout=10, what="the last progress")
    finally:
        elapsed = time.monotonic() - started
        writes = [c for c in monitor.close() if task_id in c and c.upper().startswith("SET")]
    assert 0 < seen_running["fraction"] < 1 and seen_running["note"].startswith("step ")
    assert final["note"] == "step 10 of 10" and final["at"] > 0
    # Ten reports in about 1.5 s: at most one write per 0.5 s, plus the final one.
    assert 2 <= len(writes) <= elapsed / 0.5 + 2 and len(writes) < 10, writes


def test_bad_progress_is_refused_with_a_clear_error(workers):
    type_name = unique("hist-badprogress")
    define(type_name, handler="demo.progress", lane=THREADS_LANE)
    api = _api(type_name)
    refusals = {}
    for bad, note in ((1.5, None), (-0.1, None), ("half", None), (True, None), (0.5, "x" * 201), (0.5, "a\nb")):
        task_id = _dispatch(api, type_name, {"bad": bad, "note": note})
        _done(task_id)
        refusals[(repr(bad), note and note[:3])] = _state(api, task_id)["result"]["refused"]
    assert all(refusals.values()), refusals
    texts = list(refusals.values())
    assert "from 0 to 1, got 1.5" in texts[0] and "got -0.1" in texts[1]
    assert "not str" in texts[2] and "not bool" in texts[3]
    assert "201 characters" in texts[4] and "printable" in texts[5]


def test_a_task_retried_twice_then_succeeding(workers, admin_client, rc):
    type_name = unique("hist-flaky")
    define(type_name, handler="demo.flaky", lane=PREFORK_LANE,
           policy={"max_retries": 3, "initial_backoff": 0.2, "multiplier": 2.0, "max_backoff": 1.0, "jitter": 0.0})
    api = _api(type_name)
    task_id = _dispatch(api, type_name, {"fail": "retry", "fail_times": 2}, priority=7, metadata={"who": "test"})
    _done(task_id)
    story = wait_until(lambda: (h := _state(api, task_id, history=True)["history"]) and h["attempt_count"] == 3
                       and h["attempts"][-1]["outcome"] == "succeeded" and h, timeout=10, what="3 attempts")
    assert story["state"] == "SUCCESS" and story["by"].startswith("token:")
    dispatched = story["dispatched"]
    assert dispatched["type"] == type_name and dispatched["lane"] == PREFORK_LANE
    assert dispatched["options"]["priority"] == 7 and dispatched["options"]["metadata"] == {"who": "test"}
    outcomes = [a["outcome"] for a in story["attempts"]]
    assert outcomes == ["failed, retried", "failed, retried", "succeeded"], outcomes
    delays = [a["retry_delay_s"] for a in story["attempts"][:2]]
    assert delays == [0.2, 0.4], delays  # the policy's backoff, no jitter
    assert all(a["worker"] and a["started_at"] <= a["ended_at"] for a in story["attempts"])
    assert "asked to fail attempt 1" in story["attempts"][0]["error"]
    assert story["result"]["state"] == "SUCCESS" and story["dead_letter"] is None
    page = admin_client.get(f"/admin/tasks/history/{task_id}/").content.decode()
    assert 'id="attempt-count">3<' in page and "failed, retried" in page and "0.400 s" in page
    assert "tombstone" not in page.lower()
    # The task search finds it just finished (Redis keeps its outcome briefly), in a user's words.
    wait_until(lambda: not rc.exists(keys.task_record(task_id)), timeout=10, what="record settled")
    found = admin_client.get(f"/admin/dashboard/tasks/?kind=task&q={task_id}").content.decode()
    assert "just finished" in found and "tombstone" not in found.lower()
    assert f'href="/admin/tasks/history/{task_id}/"' in found


def test_a_cancelled_task_sent_for_later(workers, admin_client):
    type_name = unique("hist-later")
    define(type_name, lane=THREADS_LANE)
    api = _api(type_name)
    task_id = _dispatch(api, type_name, {"x": 1}, countdown=30)
    page = admin_client.get(f"/admin/tasks/history/{task_id}/").content.decode()
    assert 'data-state="SCHEDULED"' in page and "scheduled for later" in page
    assert _state(api, task_id, history=True)["history"]["waiting"]["state"] == "scheduled"
    assert api.post(f"/tasks/{task_id}/cancel", {"reason": "not needed"}).status_code == 200
    story = wait_until(lambda: (h := _state(api, task_id, history=True)["history"])["state"] == "REVOKED" and h,
                       timeout=10, what="cancelled")
    assert story["attempt_count"] == 0 and "not needed" in story["cancelled"]["detail"]
    assert story["dispatched"]["options"].get("eta")


def test_an_expired_task_that_never_started_shows_0_attempts(admin_client):
    lane = unique("hist-nobody")  # no worker serves it
    type_name = unique("hist-expiring")
    define(type_name, lane=lane, timeout=1, attempt_timeout=1, chat_scoped=True)
    api = _api(type_name)
    task_id = _dispatch(api, type_name, {"x": 1}, chat_id=unique("chat"))
    waiting = _state(api, task_id, history=True)["history"]["waiting"]
    assert waiting["lane"] == lane and waiting.get("chat_position") == 0, waiting
    time.sleep(1.2)
    wait_until(lambda: expire_due() >= 0 and _state(api, task_id)["state"] == "FAILURE", timeout=20,
               what="expired")
    story = _state(api, task_id, history=True)["history"]
    assert story["attempt_count"] == 0 and story["dead_letter"]["reason"] == "expired"
    assert story["dispatched"]["lane"] == lane
    page = admin_client.get(f"/admin/tasks/history/{task_id}/").content.decode()
    assert 'id="attempt-count">0<' in page and "dead letter (expired)" in page and "tombstone" not in page.lower()


def test_a_dead_letter_and_another_tokens_task(workers):
    type_name = unique("hist-fatal")
    define(type_name, handler="demo.flaky", lane=THREADS_LANE)
    api, other = _api(type_name), _api(type_name)
    task_id = _dispatch(api, type_name, {"fail": "fatal"})
    _done(task_id, "FAILURE")
    story = wait_until(lambda: (h := _state(api, task_id, history=True)["history"])["attempt_count"] == 1
                       and h["attempts"][0]["outcome"] == "dead letter" and h, timeout=10, what="dead attempt")
    assert story["dead_letter"]["reason"] == "non_retryable" and "for good" in story["attempts"][0]["error"]
    for path in (f"/tasks/{task_id}?history=1", f"/tasks/{task_id}"):
        refused = other.get(path)
        assert refused.status_code == 404 and refused.json()["reason"] == "unknown_task"


def test_the_page_escapes_what_it_shows(workers, admin_client):
    type_name = unique("hist-escape")
    define(type_name, handler="demo.progress", lane=THREADS_LANE)
    api = _api(type_name)
    task_id = _dispatch(api, type_name, {"steps": 1, "note": "<script>alert(1)</script>"})
    _done(task_id)
    wait_until(lambda: _state(api, task_id)["progress"], timeout=10, what="progress")
    page = admin_client.get(f"/admin/tasks/history/{task_id}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert admin_client.get("/admin/tasks/history/no-such-task/").status_code == 404


def _events_noted(task_id: str, kinds: list[str]) -> None:
    from tasks import history

    for n, kind in enumerate(kinds):
        history.note(task_id, kind, attempt=1 if kind != "dispatched" else 0, at=1000.0 + n)


def _story(task_id: str) -> list[str]:
    from tasks import history_view

    found = history_view.read(task_id)
    return [event["kind"] for event in found.events] if found else []


def test_a_tasks_history_is_one_command_a_flush_and_keeps_its_expiry(rc):
    """A task whose events fall in one flush costs one SET (made with its expiry); a later flush one
    APPEND, which keeps it. Before: an RPUSH and an EXPIRE (docs/redis-budget.md)."""
    from tasks import history

    task_id = unique("hist-cost")
    key = keys.task_history(task_id)
    monitor = Monitor(rc, key)
    try:
        _events_noted(task_id, ["dispatched", "started", "succeeded"])
        history.flush()
        _events_noted(task_id, ["cancel_asked"])
        history.flush()
        rc.exists(key)  # the last command the monitor must see before it stops
        wait_until(lambda: any(c.upper().startswith("EXISTS") for c in monitor.seen), timeout=10,
                   what="the monitor caught up")
    finally:
        seen = [c.split(" ", 1)[0].upper() for c in monitor.close() if key in c]
    seen.remove("EXISTS")
    # The flusher's own thread may have written the first events before this test's flush: then a SET
    # and APPENDs all the same, never a command of another kind.
    assert seen[0] == "SET" and set(seen[1:]) == {"APPEND"} and len(seen) <= 4, seen
    assert _story(task_id) == ["dispatched", "started", "succeeded", "cancel_asked"]
    assert 0 < rc.ttl(key) <= history.retention_s()


def test_a_history_another_process_began_or_a_list_from_before_is_added_to(rc):
    """The SET finds the key (a cancel's process wrote first): the events are appended to it, under its
    expiry; a history written as a list (the format before) is pushed onto, and reads back whole."""
    from tasks import history

    first, old = unique("hist-other"), unique("hist-list")
    rc.set(keys.task_history(first), '{"kind":"dispatched","at":1.0}\n', ex=500)
    rc.rpush(keys.task_history(old), '{"kind":"dispatched","at":1.0}')
    rc.expire(keys.task_history(old), 500)
    for task_id in (first, old):
        _events_noted(task_id, ["started", "succeeded"])
    history.flush()
    for task_id in (first, old):
        assert _story(task_id) == ["dispatched", "started", "succeeded"], task_id
        assert 0 < rc.ttl(keys.task_history(task_id)) <= 500


def test_a_long_history_is_trimmed_to_its_last_events(rc):
    from tasks import history

    task_id = unique("hist-long")
    for n in range(history.HISTORY_MAX + 30):
        history.note(task_id, "retry", attempt=history.TRIM_FROM_ATTEMPT + n, at=1000.0 + n)
    history.flush()
    history.note(task_id, "dead", attempt=history.TRIM_FROM_ATTEMPT + 200, at=5000.0)
    history.flush()
    events = history.events_of(rc.get(keys.task_history(task_id)))
    assert len(events) == history.HISTORY_MAX and events[-1].startswith('{"kind":"dead"')
    assert rc.ttl(keys.task_history(task_id)) > 0


def test_a_task_that_keeps_its_row_writes_no_history_command_its_row_carries_the_events(workers, rc):
    """The events a worker still holds when it stores a success's row ride in that row (its ``meta``), not in a
    ``SET`` of the task's key: none of these tasks' keys sees a command unless a flush fell while it ran (a
    thread worker's group path and a prefork worker's Celery path). Before: a SET each (docs/redis-budget.md)."""
    from tasks import history

    stories = {}
    for lane in (THREADS_LANE, PREFORK_LANE):
        type_name = unique("hist-row")
        define(type_name, lane=lane)
        api = _api(type_name)
        monitor = Monitor(rc, keys.task_history(""))
        try:
            ids = [_dispatch(api, type_name, {"i": i}) for i in range(12)]
            for task_id in ids:
                _done(task_id)
            time.sleep(2 * history.FLUSH_EVERY_S)  # any flush of theirs has run
            last = keys.task_history(unique("hist-last"))
            rc.exists(last)  # the last command the monitor must see before it stops
            wait_until(lambda m=monitor, k=last: any(k in c for c in m.seen), timeout=10,
                       what="the monitor caught up")
        finally:
            seen = monitor.close()
        written = {t for t in ids if any(keys.task_history(t) in c for c in seen)}
        # A flush between a task's start and its row's store writes its first events (rare for a no-op, more
        # often on a loaded machine); before, every task's key was written.
        assert len(written) <= len(ids) // 2, (lane, written)
        for task_id in ids:
            story = _state(api, task_id, history=True)["history"]
            stories[task_id] = story
            assert [a["outcome"] for a in story["attempts"]] == ["succeeded"], (lane, story)
            assert story["dispatched"]["type"] == type_name and story["state"] == "SUCCESS"
            kinds = [e["kind"] for e in story["events"]]
            assert kinds == ["dispatched", "started", "succeeded"], (lane, kinds)
        carried = [t for t in ids if history.ROW_META_KEY in TaskResult.objects.get(task_id=t).meta]
        assert len(carried) >= len(ids) - len(ids) // 2, (lane, carried)


def _row(task_id: str, meta: str) -> dict:
    return {"task_id": task_id, "status": "SUCCESS", "result": "null", "traceback": None, "meta": meta,
            "content_encoding": "utf-8", "content_type": "application/json", "periodic_task_name": None,
            "task_name": "t", "task_args": None, "task_kwargs": None, "worker": "w"}


def test_a_rows_events_survive_its_row_stored_again_and_go_with_the_historys_expiry(rc):
    """A finished task's copy redelivered stores its row again from a process holding none of its events: the
    stored row keeps them (tasks/results.py's upsert). Past the history's retention the reader shows none."""
    import datetime as dt
    import json

    from django.test import override_settings
    from django.utils import timezone

    from tasks import history, history_view, results

    task_id = unique("hist-restore")
    events = '{"kind":"dispatched","at":1000.0}\n{"kind":"started","attempt":1,"at":1001.0,"worker":"w"}\n' \
             '{"kind":"succeeded","attempt":1,"at":1002.0}\n'
    results.upsert_rows(None, [_row(task_id, json.dumps({"children": [], history.ROW_META_KEY: events}))])
    results.upsert_rows(None, [_row(task_id, json.dumps({"children": []}))])  # the redelivered copy's row
    assert _story(task_id) == ["dispatched", "started", "succeeded"]
    assert [a.outcome for a in history_view.read(task_id).attempts] == ["succeeded"]
    # A row with events of its own replaces them (a later row that carries some is the newer story).
    results.upsert_rows(None, [_row(task_id, json.dumps({history.ROW_META_KEY: '{"kind":"started","at":5.0}\n'}))])
    assert _story(task_id) == ["started"]
    TaskResult.objects.filter(task_id=task_id).update(date_done=timezone.now() - dt.timedelta(seconds=61))
    assert _story(task_id) == ["started"]
    with override_settings(DISPATCH_HISTORY_TTL_S=60):  # past it: its key would have expired, so does this
        assert _story(task_id) == []


def test_events_go_to_a_final_row_only_and_come_back_when_it_is_not_stored(rc):
    """``take_for_row`` takes a task's buffered events for a success's or a dead letter's row, never a RETRY's
    (a later attempt's row replaces it); ``give_back`` puts them first in line again when the row failed."""
    from tasks import history

    task_id = unique("hist-take")
    with history._flush_lock:  # this process's flusher writes nothing meanwhile
        _events_noted(task_id, ["dispatched", "started"])
        assert history.take_for_row(task_id, "RETRY") == ""
        # Rows that do not outlive a history (as their caller read it: tasks.results.RowTerms) carry none.
        assert history.take_for_rows([(task_id, "SUCCESS")], outlive=False) == [""]
        taken = history.take_for_row(task_id, "SUCCESS")
        assert [json_kind(line) for line in history.events_of(taken)] == ["dispatched", "started"]
        assert history.take_for_row(task_id, "SUCCESS") == ""  # taken: the flush will not write them
        history.note(task_id, "succeeded", attempt=1, at=2000.0)
        history.give_back(task_id, taken)
        assert [json_kind(line) for line in history.events_of(history.take_for_row(task_id, "FAILURE"))] == \
            ["dispatched", "started", "succeeded"]


def json_kind(line: str) -> str:
    import json

    return json.loads(line)["kind"]
