"""Cancel by task id without a key written for it (issue 18: no cost on the hot path for callers that never cancel).

Admission of a chat-scoped task writes nothing outside its chat's keys and its
lane's: a cancel by task id alone finds the record in the sets that hold every
live record (lanes.records), and a caller that knows the chat pays no scan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from django_celery_results.models import TaskResult

from lanes import keys, records
from ops import task_search
from tasks import cancel as cancelling
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique

ROOT = Path(__file__).resolve().parents[2]
N = 20


def calls(rc, command: str) -> int:
    return int(rc.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_chat_admission_writes_no_key_of_its_own_for_a_cancel(rc):
    name, lane = unique("lk"), unique("llk")
    define(name, lane=lane, chat_scoped=True)
    chats = [unique("chat") for _ in range(2)]
    sets_before = calls(rc, "set")
    ids = [dispatch.delay(name, {"n": i}, chat_id=chats[i % 2]).task_id for i in range(N)]
    # Plain SETs do not grow with the number of chat dispatches (main wrote one per task).
    assert calls(rc, "set") - sets_before < N // 2
    for i, task_id in enumerate(ids):
        # The only key named after the task is its record, under its chat's hash tag.
        assert [k.decode() for k in rc.scan_iter(f"*{task_id}*", count=10_000)] == [
            keys.task_record(task_id, chats[i % 2])]


def test_cancel_by_task_id_alone_finds_every_kind_of_waiting_or_running_chat_task(rc):
    name, lane, chat = unique("lk"), unique("llk"), unique("chat")
    define(name, lane=lane, chat_scoped=True, timeout=600)
    queued = [dispatch.delay(name, {"n": i}, chat_id=chat).task_id for i in range(3)]
    later_chat = unique("chat")
    scheduled = [dispatch.delay(name, {"n": i}, chat_id=later_chat, countdown=300).task_id for i in range(2)]
    running_chat = unique("chat")
    running = dispatch.delay(name, {"n": 0}, chat_id=running_chat).task_id
    record = keys.task_record(running, running_chat)
    # As start.lua claims it: running, out of the deadlines set, in the leases set.
    rc.hset(record, "st", "running")
    rc.zrem(keys.DEADLINES, record)
    rc.zadd(keys.LEASES, {record: 1e13})
    assert records.locate(rc, running) == record
    assert dispatch.cancel(queued[1], "middle").outcome == "cancelled"
    assert dispatch.cancel(queued[0], "head").outcome == "cancelled"
    assert dispatch.cancel(scheduled[1], "behind, for later").outcome == "cancelled"
    assert dispatch.cancel(scheduled[0], "head, for later").outcome == "cancelled"
    assert dispatch.cancel(running, "running").outcome == "running_told"
    assert b"running" in rc.hget(record, "cx")
    assert [x.decode() for x in rc.lrange(keys.chat_queue(chat), 0, -1)] == [queued[2]]
    assert rc.hget(keys.task_record(queued[2], chat), "st") == b"queued"
    assert not rc.exists(keys.chat_queue(later_chat))
    gone = queued[:2] + scheduled
    assert {r.status for r in TaskResult.objects.filter(task_id__in=gone)} == {"REVOKED"}
    assert {dispatch.cancel(t).outcome for t in gone} == {"already_cancelled"}
    rc.zrem(keys.LEASES, record)
    rc.delete(record)


def test_a_caller_that_knows_the_chat_pays_no_scan(rc):
    name, lane, chat = unique("lk"), unique("llk"), unique("chat")
    define(name, lane=lane, chat_scoped=True)
    first = dispatch.delay(name, {"n": 0}, chat_id=chat, idempotency_key=unique("k"))
    second = dispatch.delay(name, {"n": 1}, chat_id=chat)
    third = dispatch.delay(name, {"n": 2}, chat_id=chat, idempotency_key="k3-" + chat)
    scans = calls(rc, "zscan")
    assert second.cancel("from its result").outcome == "cancelled"
    assert dispatch.cancel(first.task_id, "with its chat", chat_id=chat).outcome == "cancelled"
    assert dispatch.cancel_key(name, "k3-" + chat, "its key knows the chat").outcome == "cancelled"
    assert calls(rc, "zscan") == scans
    # A wrong chat costs the scan, never a wrong answer.
    fourth = dispatch.delay(name, {"n": 3}, chat_id=chat)
    assert dispatch.cancel(fourth.task_id, chat_id=unique("other")).outcome == "cancelled"
    assert cancelling.cancel_task(third.task_id, chat_id="a" * 1000).outcome == "invalid"


def test_lookup_matches_the_whole_id_and_escapes_glob_characters(rc):
    chat = unique("chat")
    odd = ["a*b", "a?b", "a[b]c", "a\\b", "ab"]
    members = {keys.task_record(t, chat): 1e13 for t in [*odd, "xab", "ab-more"]}
    rc.zadd(keys.DEADLINES, members)
    try:
        for task_id in odd:
            assert records.locate(rc, task_id) == keys.task_record(task_id, chat), task_id
        assert records.locate(rc, "b") is None and records.locate(rc, "a") is None
    finally:
        rc.zrem(keys.DEADLINES, *members)


def test_search_by_id_shows_the_chat_and_the_cli_takes_it(rc):
    name, lane, chat = unique("lk"), unique("llk"), unique("chat")
    define(name, lane=lane, chat_scoped=True)
    ids = [dispatch.delay(name, {"n": i}, chat_id=chat).task_id for i in range(3)]
    row = task_search.task(ids[1])
    assert row is not None and row.chat == chat and row.state == "queued" and row.where == "redis"
    done = subprocess.run([sys.executable, "manage.py", "cancel", ids[1], "--in-chat", chat, "--json"], cwd=ROOT,
                          env=os.environ.copy(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["outcome"] == "cancelled"
    assert task_search.task(ids[1]).state == "cancelled"
