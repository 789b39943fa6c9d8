"""Measurement (not part of ``make test``): every Redis command a plain and a chat-scoped task cost in steady
flow, by script and by key, seen by ``MONITOR`` (docs/redis-budget.md's table comes from here).

Run: ``.venv/bin/python -m pytest tests/integration/bench_redis_breakdown.py -s -q -p no:randomly`` (about a
minute). A thread worker (8 threads) of one lane; ``TASKS`` tasks sent one at a time, ``PACE_S`` apart (a
steady flow the worker keeps up with: most pops carry one task), each chat-scoped one in the next of 1,000
chats; the sampler's lock held, as ``test_redis_budget`` holds it. A command run inside a script is charged to
the script (``EVALSHA`` is logged before what it runs); one from a client outside any script to ``-``. Keys
are shown with their task id, chat, lane and process replaced. Prints the table and writes it to
``/tmp/redis-breakdown-<plain|chat>.txt``; nothing here asserts a count (``test_redis_budget`` does).
"""

from __future__ import annotations

import collections
import pathlib
import re
import time

from django_celery_results.models import TaskResult

from lanes import keys
from lanes.lua import loader
from lanes.lua.loader import script
from tasks.dispatch import dispatch
from tests.integration.test_doorbells import Monitor
from tests.support.helpers import define, unique, wait_until

TASKS = 200
PACE_S = 0.004
CHATS = 1000


def _shown(key: str, lane: str, type_name: str) -> str:
    key = key.replace(lane, "<lane>").replace(type_name, "<type>")
    key = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", key)
    key = re.sub(r"\{bd-\d+\}", "{<chat>}", key)
    key = re.sub(r":[^:]+:\d+$", ":<process>", key) if key.startswith(("dispatch:held:", "dispatch:inhand:")) else key
    return re.sub(r"\d{5,}", "<n>", key)[:70]


def _script_names() -> dict[str, str]:
    names = {}
    for path in pathlib.Path(loader.__file__).parent.glob("*.lua"):
        if not path.name.startswith("_"):
            names[script(path.stem).sha] = path.stem
    return names


def breakdown(rc, start_worker, chat: bool) -> str:
    lane, type_name = unique("bd"), unique("bd-echo")
    define(type_name, lane=lane, chat_scoped=chat, chat_queue_size=10_000)
    start_worker(lane, pool="threads", concurrency=8, env={"DISPATCH_PROMOTE_INTERVAL_S": "2"})

    def chat_of(i: int) -> dict:
        return {"chat_id": f"bd-{i % CHATS}"} if chat else {}

    for i in range(10):
        dispatch.delay(type_name, {"warm": i}, **chat_of(i)).get(timeout=60)
    time.sleep(1.5)
    names = _script_names()
    rc.set(keys.SAMPLE_LOCK, "held by bench_redis_breakdown", px=300_000)
    try:
        with Monitor(rc) as monitor:
            ids = []
            for i in range(TASKS):
                ids.append(dispatch.delay(type_name, {"i": i}, **chat_of(i)).task_id)
                time.sleep(PACE_S)
            wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == TASKS,
                       timeout=120, what="every result stored")
            records = [keys.task_record(t, chat_of(i).get("chat_id")) for i, t in enumerate(ids)]
            wait_until(lambda: rc.exists(*records) == 0, timeout=30, what="every record settled")
            time.sleep(1.2)  # the counters' flush
    finally:
        rc.delete(keys.SAMPLE_LOCK)
    by: collections.Counter = collections.Counter()
    current = "?"
    for c in monitor.seen:
        parts = c["command"].split(" ")
        command = parts[0].upper()
        key = _shown(parts[1], lane, type_name) if len(parts) > 1 else ""
        if c["client_type"] == "lua":
            by[(current, command, key)] += 1
        elif command in ("EVALSHA", "EVAL"):
            current = names.get(parts[1], parts[1][:8])
            by[(current, "EVALSHA", "")] += 1
        else:
            by[("-", command, key)] += 1
    per_script: collections.Counter = collections.Counter()
    for (name, _, _), v in by.items():
        per_script[name] += v
    lines = [f"{'chat-scoped' if chat else 'plain'}: {sum(by.values()) / TASKS:.2f} commands a task, {TASKS} tasks",
             "by script: " + ", ".join(f"{name} {v / TASKS:.2f}" for name, v in per_script.most_common()), "",
             "| script | command | key | per task |", "|---|---|---|--:|"]
    for (name, command, key), v in sorted(by.items(), key=lambda kv: (-per_script[kv[0][0]], -kv[1])):
        if v / TASKS >= 0.05:
            lines.append(f"| {name} | {command} | `{key}` | {v / TASKS:.2f} |")
    text = "\n".join(lines)
    print(text)
    pathlib.Path(f"/tmp/redis-breakdown-{'chat' if chat else 'plain'}.txt").write_text(text)
    return text


def test_plain(start_worker, rc):
    breakdown(rc, start_worker, chat=False)


def test_chat(start_worker, rc):
    breakdown(rc, start_worker, chat=True)
