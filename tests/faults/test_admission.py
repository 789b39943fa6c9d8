"""Scenarios 7 and 8: one idempotency key raced by 50 dispatches; hostile input at every door."""

from __future__ import annotations

import io
import json
import pickle
import re
import time

import pytest
from django.core.management import CommandError, call_command

from lanes import keys
from tests.faults.harness import deliveries, pick
from tests.support.helpers import define, lane_depth, unique, wait_until
from tools.loadcheck import Op, check


def _race(cluster, calls: list[dict], processes: int):
    """Send ``calls`` from ``processes`` load-generator processes, all released at once."""
    go = cluster.dir / unique("go")
    loads = []
    for i in range(processes):
        ready = cluster.dir / unique("ready")
        loads.append((ready, cluster.load({"mode": "burst", "calls": calls[i::processes], "ready_file": str(ready),
                                           "go_file": str(go)})))
    wait_until(lambda: all(ready.exists() for ready, _ in loads), timeout=120, interval=0.05,
               what="load generators ready")
    go.touch()
    answers = []
    for _, load in loads:
        load.wait(timeout=60)
        answers += load.entries()
    return answers


def test_07_fifty_concurrent_dispatches_with_one_idempotency_key(cluster_factory, record):
    started = time.time()
    cluster = cluster_factory()
    lane = unique("fl-idem")
    name = cluster.http_type(lane)
    cluster.worker(lane, concurrency=2)
    run = unique("r")
    n, processes = 50, pick(5, 10)

    # Both races (one payload; two payloads) on their own keys and chats, from one set of
    # processes released together: each key still meets its 50 racers at once.
    same = f"{run}:chat-a:0"
    conflict_key = f"{run}:chat-b:0"
    identical = [{"type": name, "payload": {"seq": 0, "run": run}, "key": same, "chat": "chat-a"}] * n
    mixed = [{"type": name, "payload": {"seq": 0, "run": run, "v": i % 2}, "key": conflict_key, "chat": "chat-b"}
             for i in range(n)]
    both = _race(cluster, [c for pair in zip(identical, mixed, strict=True) for c in pair], processes)
    answers = [a for a in both if a["key"] == same]
    answers2 = [a for a in both if a["key"] == conflict_key]
    spread = max(a["t"] for a in answers) - min(a["t"] for a in answers)
    assert len(answers) == n and all(a["accepted"] for a in answers), answers
    assert len({a["task_id"] for a in answers}) == 1  # one task
    assert sum(not a["duplicate"] for a in answers) == 1  # created once; 49 were told it was a duplicate

    winners = [a for a in answers2 if a["accepted"]]
    losers = [a for a in answers2 if not a["accepted"]]
    assert len({a["task_id"] for a in winners}) == 1 and len({json.dumps(a["payload"]) for a in winners}) == 1
    assert {a["reason"] for a in losers} == {"idempotency_conflict"}
    assert len(winners) == len(losers) == n // 2  # every call with the other payload was refused
    # After the race, alone: the same key with another payload is still a conflict.
    [again] = _race(cluster, [{"type": name, "payload": {"seq": 0, "run": run, "v": "other"}, "key": same,
                               "chat": "chat-a"}], 1)
    assert not again["accepted"] and again["reason"] == "idempotency_conflict"

    wait_until(lambda: len(cluster.sink.sink.applied) >= 2, timeout=30, what="both tasks applied")
    time.sleep(1.0)
    ops = [Op("chat-a", 0, same, True, answers[0]["task_id"]),
           Op("chat-b", 0, conflict_key, True, winners[0]["task_id"])]
    rep = check(ops, deliveries(cluster.sink.sink, [run]), {}, scenario="7 one key, 50 racers")
    rep.offered = 2 * n + 1
    rep.rejected = len(losers) + 1
    rep.extra["race"] = {"calls": 2 * n + 1, "processes": processes, "start_spread_s": round(spread, 3),
                         "tasks_created": 2, "told_duplicate": n - 1 + len(winners) - 1,
                         "idempotency_conflict": len(losers) + 1}
    record("07-idempotency-race", rep, started)
    assert rep.accounted and rep.redeliveries == 0, rep.summary()


# -- 8: hostile input -----------------------------------------------------------------------

NUL = "\x00"
BAD_UTF8 = "\udcff"  # a lone surrogate: what undecodable bytes become in Python text


def _hostile_dispatches(name: str) -> list[tuple[str, dict, str]]:
    """(label, dispatch kwargs, expected reason) of everything a caller can get wrong."""
    deep: dict = {}
    cur = deep
    for _ in range(5000):
        cur["x"] = {}
        cur = cur["x"]
    cases = [
        ("payload is a list", {"payload": [1, 2]}, "invalid_payload"),
        ("payload is a string", {"payload": "{}"}, "invalid_payload"),
        ("payload is bytes", {"payload": b"{}"}, "invalid_payload"),
        ("payload holds NaN", {"payload": {"x": float("nan")}}, "invalid_payload"),
        ("payload holds infinity", {"payload": {"x": float("inf")}}, "invalid_payload"),
        ("payload holds a set", {"payload": {"x": {1, 2}}}, "invalid_payload"),
        ("payload holds bytes", {"payload": {"x": b"\xff"}}, "invalid_payload"),
        ("payload has bad UTF-8", {"payload": {"x": BAD_UTF8}}, "invalid_payload"),
        ("payload key has bad UTF-8", {"payload": {BAD_UTF8: 1}}, "invalid_payload"),
        ("payload nested 5000 deep", {"payload": deep}, "invalid_payload"),
        ("payload holds a 5000-digit int", {"payload": {"x": 10**4999}}, "invalid_payload"),
        ("metadata nested 5000 deep", {"metadata": deep}, "invalid_metadata"),
        # NUL cannot be stored in PostgreSQL's jsonb (a dead letter could not be written): refused (issue 12).
        ("payload value with NUL", {"payload": {"text": f"a{NUL}b"}}, "invalid_payload"),
        ("payload key with NUL", {"payload": {f"k{NUL}": 1}}, "invalid_payload"),
        ("metadata with NUL", {"metadata": {"trace": f"t{NUL}"}}, "invalid_metadata"),
        ("payload of 1 MB", {"payload": {"x": "a" * 1_000_000}}, "payload_too_large"),
        ("payload of 10 MB", {"payload": {"x": "\u00e9" * 5_000_000}}, "payload_too_large"),
        ("chat id with NUL", {"chat_id": f"c{NUL}1"}, "invalid_chat_id"),
        ("chat id with bad UTF-8", {"chat_id": f"c{BAD_UTF8}"}, "invalid_chat_id"),
        ("chat id of 10 MB", {"chat_id": "c" * 10_000_000}, "invalid_chat_id"),
        ("chat id empty", {"chat_id": ""}, "invalid_chat_id"),
        ("chat id is a number", {"chat_id": 42}, "invalid_chat_id"),
        ("chat id missing", {"chat_id": None}, "invalid_chat_id"),
        ("chat id with newline", {"chat_id": "a\nb"}, "invalid_chat_id"),
        ("key with NUL", {"idempotency_key": f"k{NUL}"}, "invalid_idempotency_key"),
        ("key with bad UTF-8", {"idempotency_key": f"k{BAD_UTF8}"}, "invalid_idempotency_key"),
        ("key of 1 MB", {"idempotency_key": "k" * 1_000_000}, "invalid_idempotency_key"),
        ("key is a dict", {"idempotency_key": {"a": 1}}, "invalid_idempotency_key"),
        ("priority 10", {"priority": 10}, "invalid_priority"),
        ("priority True", {"priority": True}, "invalid_priority"),
        ("priority '9'", {"priority": "9"}, "invalid_priority"),
        ("timeout NaN", {"timeout": float("nan")}, "invalid_timeout"),
        ("timeout negative", {"timeout": -1}, "invalid_timeout"),
        ("timeout 10 years", {"timeout": 315_360_000}, "invalid_timeout"),
        ("metadata is a list", {"metadata": [1]}, "invalid_metadata"),
        ("metadata of 1 MB", {"metadata": {"x": "m" * 1_000_000}}, "invalid_metadata"),
        ("metadata with bad UTF-8", {"metadata": {"x": BAD_UTF8}}, "invalid_metadata"),
    ]
    out = []
    for label, change, reason in cases:
        kwargs = {"task_type": name, "payload": {"ok": 1}, "chat_id": "hostile", **change}
        out.append((label, kwargs, reason))
    out += [
        ("unknown type", {"task_type": "no.such.type", "payload": {}, "chat_id": "c"}, "unknown_type"),
        ("type name with NUL", {"task_type": f"x{NUL}", "payload": {}, "chat_id": "c"}, "unknown_type"),
        ("type name is a list", {"task_type": ["x"], "payload": {}, "chat_id": "c"}, "unknown_type"),
        ("type name of 1 MB", {"task_type": "t" * 1_000_000, "payload": {}, "chat_id": "c"}, "unknown_type"),
    ]
    return out


def test_08_hostile_input_at_every_door(start_worker, sink, rc, tmp_path, record):
    from celery.result import AsyncResult

    from dispatchsite.celery import app
    from lanes.messages import Envelope, build_message, kombu_message
    from tasks.dispatch import dispatch
    from tasks.models import DeadLetter

    started = time.time()
    name, lane = unique("hostile"), unique("l-hostile")
    define(name, handler="http.post", lane=lane, chat_scoped=True, options={"url": sink.url})
    worker = start_worker(f"{lane},ingress", concurrency=2)
    offered = refused = accepted = 0
    wrong = []

    # Door 1: dispatch in the caller. Every bad argument is a rejection with its reason, nothing stored.
    for label, kwargs, reason in _hostile_dispatches(name):
        offered += 1
        result = dispatch.delay(kwargs.pop("task_type"), kwargs.pop("payload"), **kwargs)
        if result.accepted or result.reason != reason or not result.detail:
            wrong.append((label, result.reason, result.detail[:100]))
        refused += not result.accepted
    assert not wrong, wrong
    assert lane_depth(rc, lane) == 0 and not list(rc.scan_iter("dispatch:chat:{hostile}*"))

    # Odd text *inside* a payload is data: carried intact and delivered (NUL is refused above).
    odd = {"text": "a\u0001b", "k\u2028": "\u202e\ufeff\U0001F600", "quote": '"\\\u0007'}
    result = dispatch.delay(name, odd, chat_id="odd-but-fine", idempotency_key="k\u00e9y-\U0001F600")
    offered += 1
    accepted += result.accepted
    assert result.accepted, result
    wait_until(lambda: any(a.body == odd for a in sink.sink.attempts), timeout=30, what="odd payload delivered")

    # Door 2: the same call by name through the ingress queue (services that do not import this code).
    by_name = [
        (("no.such.type", {}), {"chat_id": "c"}, "unknown_type"),
        ((name, [1]), {"chat_id": "c"}, "invalid_payload"),
        ((name, {"x": 1}), {"chat_id": "c", "surprise": 1}, "invalid_payload"),
        ((name, {"x": "y" * 2_000_000}), {"chat_id": "c"}, "payload_too_large"),
        ((name, {"x": 1}), {"chat_id": "c" * 500}, "invalid_chat_id"),
    ]
    for args, kwargs, reason in by_name:
        offered += 1
        answer = app.send_task("tasks.dispatch", args=list(args), kwargs=kwargs).get(timeout=30)
        assert answer["accepted"] is False and answer["reason"] == reason, (args, kwargs, answer)
        refused += 1

    # Door 3: the command line.
    for argv in (["--payload", "{not json"], ["--payload", "[1]"], ["--payload", '{"a":1}', "--priority", "99"]):
        offered += 1
        out, err = io.StringIO(), io.StringIO()
        with pytest.raises((SystemExit, CommandError)) as failed:
            call_command("dispatch", name, *argv, "--chat", "cli", stdout=out, stderr=err)
        refused += 1
        assert str(failed.value), argv

    # Door 4: the broker. Bytes pushed straight onto a lane queue never run and never kill a worker.
    marker = tmp_path / "pickle-ran"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    now = time.time()
    env = Envelope(type=name, lane=lane, priority=5, attempt=1, deadline=now + 60, dispatched_at=now, chat="b")
    template = kombu_message(build_message("x", "http.post", '{"n":1}', env, 10), "x", keys.task_record("x", "b"),
                             "x.1")
    pickled = {**template, "body": __import__("base64").b64encode(pickle.dumps(Exploit())).decode(),
               "content-type": "application/x-python-serialize", "content-encoding": "binary",
               "properties": {**template["properties"], "body_encoding": "base64"}}
    pickled["headers"] = {**template["headers"], "id": "pickle-1", "task": "http.post"}
    forged_id = {**template, "headers": {**template["headers"], "id": "forged-1"}}
    broker_garbage = [
        json.dumps(pickled),
        b"\x80\x04\x95" + pickle.dumps({"not": "json"}),
        b"\xff\xfe\x00garbage\x00",
        b"{" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,  # valid JSON, too deep to decode
        b"x" * 10_000_000,
        json.dumps({"body": "not base64!", "headers": {"task": "http.post", "id": "h-1"}}),
        json.dumps(forged_id),  # well-formed, but no such task was ever accepted: start.lua refuses it
    ]
    for raw in broker_garbage:
        offered += 1
        rc.lpush(keys.lane_queue(lane, 4), raw)
    wait_until(lambda: lane_depth(rc, lane) == 0, timeout=60, what="garbage consumed")
    time.sleep(1.0)
    assert not marker.exists(), "a pickle message was deserialised"
    assert worker.alive()
    malformed = DeadLetter.objects.filter(reason="malformed", died_at__gte=_dt(started)).count()
    assert malformed >= len(broker_garbage) - 1  # all but the forged id (dropped: never accepted)
    assert not [a for a in sink.sink.attempts if a.headers.get("X-Dispatch-Task-Id") in ("pickle-1", "forged-1")]
    refused += len(broker_garbage)

    # Door 5: the admin. A handler that is not registered, or a URL that is not allowed, is refused
    # by the form, naming the field.
    from django.contrib.auth import get_user_model
    from django.test import Client

    from lanes.models import Lane
    from tasks.models import RetryPolicy, TaskType

    admin = get_user_model().objects.filter(username="root").first() or get_user_model().objects.create_superuser(
        "root", "r@x", "pw-root-123")
    client = Client()
    client.force_login(admin)
    base = {"lane": Lane.objects.get(name=lane).pk, "retry_policy": RetryPolicy.objects.first().pk, "priority": 5,
            "timeout": 60, "attempt_timeout": 10, "chat_queue_size": 64, "max_payload_bytes": 65536,
            "idempotency_window": 3600, "enabled": "on"}
    forms = [
        ("handler not registered", {"handler": "os.system", "options": "{}"}, "handler"),
        ("import path as handler", {"handler": "subprocess.call", "options": "{}"}, "handler"),
        ("URL to a host not allowed", {"handler": "http.post", "options": '{"url": "http://169.254.169.254/x"}'},
         "options"),
        ("file URL", {"handler": "http.post", "options": '{"url": "file:///etc/passwd"}'}, "options"),
        ("options not JSON", {"handler": "http.post", "options": "{url: 1"}, "options"),
    ]
    for label, fields, field_name in forms:
        offered += 1
        type_name = unique("evil")
        response = client.post("/admin/tasks/tasktype/add/", {**base, "name": type_name, **fields})
        assert response.status_code == 200, label  # the form again, not a redirect
        html = response.content.decode()
        assert re.search(rf'class="form-row errors[^"]*field-{field_name}\b', html), (label, html[:3000])
        assert not TaskType.objects.filter(name=type_name).exists(), label
        refused += 1
    # And as configuration as code: the bad entry is named, nothing is applied.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"task_types": [{"name": "evil.cfg", "handler": "os.system", "lane": lane,
                                               "retry_policy": RetryPolicy.objects.first().name}]}))
    offered += 1
    with pytest.raises(Exception, match=r"evil\.cfg"):
        call_command("apply_config", str(bad), stdout=io.StringIO(), stderr=io.StringIO())
    refused += 1
    assert not TaskType.objects.filter(name="evil.cfg").exists()

    # After all that, the worker still serves.
    after = dispatch.delay(name, {"after": "hostile"}, chat_id="after")
    assert after.accepted and AsyncResult(after.task_id).get(timeout=30) == {"status": 200}
    assert worker.alive()
    from tools.loadcheck import Report

    rep = Report(scenario="8 hostile input", offered=offered + 1, accepted=accepted + 1, rejected=refused,
                 succeeded=accepted + 1, dead=0)
    rep.extra["hostile"] = {"dispatch_args": len(_hostile_dispatches(name)), "by_name": len(by_name), "cli": 3,
                            "broker_messages": len(broker_garbage), "malformed_dead_letters": malformed,
                            "admin_forms": len(forms), "config_files": 1}
    rep.notes.append("every hostile input refused with its reason; broker garbage recorded as `malformed` dead "
                     "letters (not counted as accepted tasks); no worker died; no pickle was deserialised")
    record("08-hostile-input", rep, started)


def _dt(epoch: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch - 1, tz=dt.UTC)
