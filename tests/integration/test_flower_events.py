"""Flower sees every task whole (type, final state, runtime, times, worker) from one task event a task.

The events are counted on the wire: a subscriber on Redis's channels of Celery's events exchange
(``celeryev``), decoding each ``task.multi`` message as Flower's receiver does. Counts only: nothing
here is about how fast anything ran.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from lanes import keys
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: Tasks run one at a time, each long enough that its received and its end often fall in different
#: 0.1 s batches (about a third of them before events were held for their run's end).
TASKS, SLEEP = 40, 0.03


class _Wire:
    """Every event message the workers publish, with its size and the events it carries."""

    def __init__(self, client) -> None:
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe("*celeryev*")
        self.messages: list[tuple[int, list[dict]]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            message = self.pubsub.get_message(timeout=0.2)
            if message is None or message.get("type") != "pmessage":
                continue
            raw = message["data"]
            envelope = json.loads(raw)
            body = envelope["body"]
            if envelope.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body)
            events = json.loads(body)
            self.messages.append((len(raw), events if isinstance(events, list) else [events]))

    def __enter__(self) -> _Wire:
        wait_until(lambda: self.pubsub.get_message(timeout=0.1) is None, timeout=5, what="subscribed")
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.pubsub.close()

    def events_of(self, ids: set[str]) -> Counter:
        return Counter(e["uuid"] for _, events in self.messages for e in events if e.get("uuid") in ids)


@pytest.fixture
def flower(tmp_path):
    root = Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "flower.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "dispatchsite.flower_server", "--address=127.0.0.1", f"--port={port}"],
        cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "FLOWER_BASIC_AUTH": "admin:events-pw"})
    auth = "Basic " + base64.b64encode(b"admin:events-pw").decode()

    def api(path: str):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": auth})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            return None

    try:
        wait_until(lambda: api("/api/workers?refresh=false") is not None, timeout=60, interval=0.2, what="flower up")
        yield api
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
        log.close()


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_flower_shows_each_task_whole_from_one_event_a_task(start_worker, flower, rc, pool):
    lane, name = unique("ev"), unique("ev-type")
    define(name, lane=lane, handler="demo.echo")
    worker = start_worker(lane, pool=pool, concurrency=2, env={"CELERY_WORKER_SEND_TASK_EVENTS": "true"})
    dispatch.delay(name, {"warm": True}).get(timeout=60)
    with _Wire(rc) as wire:
        ids = set()
        for n in range(TASKS):  # one at a time: each one's events are all its worker sends meanwhile
            result = dispatch.delay(name, {"n": n, "sleep": SLEEP})
            assert result.get(timeout=60) == {"n": n, "sleep": SLEEP}
            ids.add(result.task_id)

        def final() -> dict:
            tasks = flower(f"/api/tasks?limit=1000&taskname={name}") or {}
            return {t: tasks[t] for t in ids if t in tasks and tasks[t].get("state") == "SUCCESS"}

        wait_until(lambda: len(final()) == TASKS, timeout=60, interval=0.5, what="every task final in Flower")
        wait_until(lambda: sum(wire.events_of(ids).values()) >= TASKS, timeout=10, what="the events counted")
    tasks = final()
    for task in tasks.values():
        assert task["name"] == name and task["runtime"] >= SLEEP * 0.9, task
        assert task["received"] <= task["started"] <= task["succeeded"], task
        assert str(task["worker"]).startswith(f"{worker.name}@"), task
    per_task = wire.events_of(ids)
    assert set(per_task) == ids
    # One event a task (its succeeded, carrying received and started); a task that waited past the hold
    # on a loaded host goes as received, then its end: a few at most.
    assert sum(per_task.values()) <= TASKS + 2, sorted(per_task.values())
    types = Counter(e["type"] for _, events in wire.messages for e in events if e.get("uuid") in ids)
    assert types["task-succeeded"] == TASKS, types


def test_a_warm_stop_still_sends_the_events_of_the_tasks_it_let_end(start_worker, rc):
    # Tasks still running when the worker is told to stop end first (the warm shutdown's drain); their
    # events, held for their runs' end, must be published before Celery closes the events connection.
    lane, name = unique("evs"), unique("evs-type")
    define(name, lane=lane, handler="demo.echo")
    worker = start_worker(lane, pool="threads", concurrency=4, env={"CELERY_WORKER_SEND_TASK_EVENTS": "true"})
    dispatch.delay(name, {"warm": True}).get(timeout=60)
    with _Wire(rc) as wire:
        results = [dispatch.delay(name, {"n": n, "sleep": 0.6}) for n in range(4)]
        ids = {r.task_id for r in results}
        # Started, not ended: each run is open (held) in the worker's buffer when the stop comes.
        wait_until(lambda: all(rc.hget(keys.task_record(t), "st") == b"running" for t in ids), timeout=30,
                   interval=0.02, what="the four running")
        worker.stop(timeout=60)
        for r in results:
            assert r.get(timeout=30)["n"] in range(4)
        wait_until(lambda: len(wire.events_of(ids)) == 4, timeout=5, what="each task's events published")
    types = Counter(e["type"] for _, events in wire.messages for e in events if e.get("uuid") in ids)
    assert types["task-succeeded"] == 4, types
