"""Plain tasks in groups (tasks.grouping) change nothing about any one task: real thread workers, the loopback sink.

Every assertion is about outcomes, order and counts, as the sink, the result rows and the dead letters
record them; none is about how fast anything ran.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from django_celery_results.models import TaskResult

from tasks import config
from tasks.dispatch import dispatch
from tasks.models import DeadLetter, Limit, TaskTypeLimit
from tests.support.helpers import define, unique, wait_until
from tests.support.http_sink import SinkServer
from tools.loadcheck import Delivery, Op, check

pytestmark = pytest.mark.django_db(transaction=True)

#: Tasks in the mix, and the chats its chat-scoped ones are spread over.
MIX, CHATS = 1000, 25


@dataclass(frozen=True)
class Outcome:
    kind: str
    row: str  # the result row's state
    dead: str  # the dead letter's reason ('' for none)
    attempts: int  # requests the sink saw for it


def _run_mix(start_worker, sink: SinkServer, grouping: bool) -> tuple[dict[int, Outcome], dict[int, list]]:
    """The same mix through one thread worker; outcomes by position in the mix, and each chat's order."""
    lane = unique("grp")
    policy = {"max_retries": 2, "initial_backoff": 0.05, "max_backoff": 0.1, "jitter": 0.0}
    chat_type, short_type, limited_type = unique("grp-chat"), unique("grp-short"), unique("grp-lim")
    defined = {}
    for name, fields in ((chat_type, {"timeout": 120}), (short_type, {"timeout": 1, "attempt_timeout": 1}),
                         (limited_type, {"timeout": 120, "chat_scoped": False})):
        defined[name] = define(name, handler="http.post", lane=lane, options={"url": sink.url}, policy=policy,
                               **{"chat_scoped": True, **fields})
    lim = Limit(name=unique("l"), scope="global", max_in_flight=3)
    lim.full_clean()
    lim.save()
    TaskTypeLimit.objects.create(task_type=defined[limited_type], limit=lim, position=0)
    config.forget()
    chats = [unique("c") for _ in range(CHATS)]
    seqs = [0] * CHATS
    ops: list[Op] = []
    kinds: dict[str, tuple[int, str]] = {}
    cancelled = []
    for i in range(MIX):
        kind = ("ok", "ok", "ok", "ok", "ok", "retry", "fatal", "limited", "expired", "cancelled")[i % 10]
        c = i % CHATS
        payload: dict = {"seq": seqs[c], "i": i}
        name, chat = chat_type, chats[c]
        if kind == "retry":
            payload["sink_fail_first"] = 1
        elif kind == "fatal":
            payload["sink_status"] = 400
        elif kind == "limited":
            name, chat = limited_type, None
            payload["seq"] = i
        elif kind == "expired":
            name = short_type
        result = dispatch.delay(name, payload, chat_id=chat)
        assert result.accepted, result
        if chat is not None:
            seqs[c] += 1
        if kind == "cancelled":
            cancelled.append(result.task_id)
        kinds[result.task_id] = (i, kind)
        ops.append(Op(chat or "", payload["seq"], result.task_id, True, result.task_id, "", kind))
    for task_id in cancelled:
        assert dispatch.cancel(task_id, "mix").outcome == "cancelled"
    time.sleep(1.5)  # the short type's deadlines pass before any worker takes them
    start_worker(lane, pool="threads", concurrency=8, env={"DISPATCH_GROUPING": "true" if grouping else "false"})
    ids = list(kinds)

    def ended() -> bool:
        final = TaskResult.objects.filter(task_id__in=ids, status__in=("SUCCESS", "FAILURE", "REVOKED"))
        return final.count() == MIX

    wait_until(ended, timeout=180, what=f"{MIX} final result rows (grouping {grouping})")
    rows = dict(TaskResult.objects.filter(task_id__in=ids).values_list("task_id", "status"))
    dead = dict(DeadLetter.objects.filter(task_id__in=ids).values_list("task_id", "reason"))
    with sink.sink.lock:
        attempts = list(sink.sink.attempts)
        order = {k: list(v) for k, v in sink.sink.order.items()}
        overlaps = list(sink.sink.overlaps)
    per_key: dict[str, int] = {}
    for a in attempts:
        per_key[a.key] = per_key.get(a.key, 0) + 1
    deliveries = [Delivery(a.key, a.headers.get("X-Dispatch-Task-Id", ""), a.chat if a.chat else "",
                           a.body.get("seq"), a.status, a.started, a.at) for a in attempts]
    ended_dead = {**dead, **{t: "cancelled" for t in cancelled}}
    report = check([op for op in ops if op.kind != "limited"],
                   [d for d in deliveries if kinds.get(d.key, (0, ""))[1] != "limited"], ended_dead,
                   scenario=f"grouping-{grouping}")
    assert report.lost == 0 and report.duplicate_effects == 0 and report.order_violations == 0, report.summary()
    assert not overlaps, overlaps[:5]
    outcomes = {i: Outcome(kind, rows.get(task_id, ""), dead.get(task_id, ""), per_key.get(task_id, 0))
                for task_id, (i, kind) in kinds.items()}
    chat_orders = {c: order.get(chat, []) for c, chat in enumerate(chats)}
    return outcomes, chat_orders


def test_grouping_is_invisible_the_same_mix_ends_the_same_with_it_on_and_off(start_worker):
    with SinkServer() as on_sink:
        grouped, grouped_order = _run_mix(start_worker, on_sink, grouping=True)
    with SinkServer() as off_sink:
        single, single_order = _run_mix(start_worker, off_sink, grouping=False)
    differ = {i: (grouped[i], single[i]) for i in grouped if grouped[i] != single[i]}
    assert not differ, list(differ.items())[:5]
    assert grouped_order == single_order
    # The mix did what it says: each kind's expected ending, in both runs.
    expected = {"ok": ("SUCCESS", "", 1), "retry": ("SUCCESS", "", 2), "fatal": ("FAILURE", "non_retryable", 1),
                "limited": ("SUCCESS", "", 1), "expired": ("FAILURE", "expired", 0),
                "cancelled": ("REVOKED", "", 0)}
    wrong = {i: o for i, o in grouped.items() if (o.row, o.dead, o.attempts) != expected[o.kind]}
    assert not wrong, list(wrong.items())[:5]


def test_a_slow_task_does_not_hold_back_the_fast_ones_taken_with_it(start_worker):
    lane, name = unique("grp"), unique("grp-slow")
    define(name, lane=lane, handler="demo.echo", timeout=300, attempt_timeout=120)
    slow = dispatch.delay(name, {"sleep": 60})
    fast = [dispatch.delay(name, {"n": n}) for n in range(40)]
    start_worker(lane, pool="threads", concurrency=4)
    ids = [r.task_id for r in fast]
    wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == len(ids),
               timeout=45, what="every fast task done")
    # Claimed with (or before) the fast ones, the slow one is still running: nothing waited for it.
    assert not TaskResult.objects.filter(task_id=slow.task_id).exists()


def test_a_worker_killed_mid_group_loses_nothing_and_applies_nothing_twice(start_worker, sink, rc):
    lane, name = unique("grp"), unique("grp-kill")
    define(name, handler="http.post", lane=lane, chat_scoped=True, options={"url": sink.url}, timeout=120)
    chats = [unique("k") for _ in range(20)]
    ops = []
    for i in range(300):
        chat = chats[i % 20]
        r = dispatch.delay(name, {"seq": i // 20, "sink_delay_s": 0.02}, chat_id=chat)
        assert r.accepted
        ops.append(Op(chat, i // 20, r.task_id, True, r.task_id))
    first = start_worker(lane, pool="threads", concurrency=8)
    wait_until(lambda: len(sink.sink.applied) >= 60, timeout=60, what="a fifth applied")
    first.kill()  # SIGKILL: claimed, running and finished-not-settled tasks all in its hands
    start_worker(lane, pool="threads", concurrency=8)
    ids = {op.task_id for op in ops}
    wait_until(lambda: ids <= set(sink.sink.applied), timeout=90, what="every task applied")
    with sink.sink.lock:
        attempts = list(sink.sink.attempts)
    deliveries = [Delivery(a.key, a.headers.get("X-Dispatch-Task-Id", ""), a.chat, a.body.get("seq"), a.status,
                           a.started, a.at) for a in attempts]
    report = check(ops, deliveries, {}, scenario="grouping-sigkill")
    assert report.lost == 0 and report.duplicate_effects == 0 and report.order_violations == 0, report.summary()
    assert not sink.sink.overlaps
    wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == len(ids),
               timeout=60, what="every result row")


def test_flower_lists_every_task_of_a_group_by_type_with_its_final_state(start_worker, tmp_path):
    """Flower's own API (``/api/tasks``) sees the grouped tasks as Celery's would be: name = type, state."""
    import base64
    import json
    import os
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "flower.log", "wb")
    flower = subprocess.Popen(
        [sys.executable, "-m", "dispatchsite.flower_server", "--address=127.0.0.1", f"--port={port}"],
        cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "FLOWER_BASIC_AUTH": "admin:grouping-pw"})
    auth = "Basic " + base64.b64encode(b"admin:grouping-pw").decode()

    def api(path: str):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": auth})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            return None

    try:
        wait_until(lambda: api("/api/workers?refresh=false") is not None, timeout=60, interval=0.2,
                   what="flower up")
        lane, name = unique("grp"), unique("grp-flower")
        define(name, lane=lane, handler="demo.flaky", policy={"max_retries": 0})
        start_worker(lane, pool="threads", concurrency=8, env={"CELERY_WORKER_SEND_TASK_EVENTS": "true"})
        ok = [dispatch.delay(name, {"n": n}).task_id for n in range(60)]
        bad = dispatch.delay(name, {"fail": "fatal"}).task_id
        ids = {*ok, bad}

        def seen() -> dict:
            tasks = api(f"/api/tasks?limit=1000&taskname={name}") or {}
            return {t: tasks[t] for t in ids if t in tasks and tasks[t].get("state") in ("SUCCESS", "FAILURE")}

        wait_until(lambda: len(seen()) == len(ids), timeout=90, interval=0.5, what="every task final in Flower")
        tasks = seen()
        assert all(tasks[t]["name"] == name and tasks[t]["state"] == "SUCCESS" for t in ok), \
            [tasks[t] for t in ok if tasks[t]["state"] != "SUCCESS"][:3]
        assert tasks[bad]["state"] == "FAILURE" and tasks[bad]["name"] == name
        assert all(tasks[t].get("runtime") is not None for t in ok)
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(timeout=20)
        log.close()
