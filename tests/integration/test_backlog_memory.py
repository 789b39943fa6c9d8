"""A paused lane's backlog: what it costs Redis per task (against a budget), and that it drains once.

The bounded twin of ``manage.py backlog`` (a million tasks): counts and bytes, not times.
"""

from __future__ import annotations

import uuid

import pytest

from lanes import capacity, keys
from tests.support.helpers import define, lane_depth, unique, wait_until

N = 1000
#: Most Redis bytes a waiting plain task may cost, by MEMORY USAGE of the keys it adds (its record, its
#: reference in the lane's list, its deadline and queued lease), with the platform's Redis settings
#: (lanes.capacity.REDIS_CONFIG, which the tests' Redis runs with). Measured here: about 780 (the lane
#: list naming the record, the record holding the message compact); 2,200-2,830 with the whole message
#: in the record and again in the list; 3,600 before the setting.
BYTES_PER_WAITING_TASK_BUDGET = 850
#: The same for a chat-scoped task, 20 a chat (one head a chat published, the rest in its chat's queue):
#: about 700 measured here; 1,450 with the whole message in the record.
BYTES_PER_WAITING_CHAT_TASK_BUDGET = 780
CHATS = 50


@pytest.fixture
def mark_handler():
    import tools.bench_tasks  # noqa: F401 - registers bench.mark (its workers import it with -I)
    from tools.bench_tasks import mark_key, twice_key

    return mark_key, twice_key


def test_a_paused_lanes_backlog_fits_its_budget_and_drains_once(rc, start_worker, mark_handler):
    from ops import control
    from tools import memory

    mark_key, twice_key = mark_handler
    name, lane, run = unique("backlog"), unique("l-backlog"), uuid.uuid4().hex[:8]
    define(name, handler="bench.mark", lane=lane, timeout=600)
    control.pause(lane, "test")
    keys_before = rc.dbsize()
    commands_before, cpu_before = _commands(rc), _redis_cpu_s(rc)

    report = memory.measure(name, lane, [{"run": run, "n": i} for i in range(N)])

    parts = report["parts"]
    assert report["parts_total"] <= BYTES_PER_WAITING_TASK_BUDGET, parts
    # One record per task, the messages in the lane's lists; nothing else grows per task.
    assert rc.dbsize() - keys_before <= N + 5
    assert lane_depth(rc, lane) == N
    assert int(rc.get(keys.lane_waiting(lane))) == N
    assert parts["record"] > 0 and parts["lane list"] > 0 and parts["deadlines"] > 0
    assert parts["chat queue"] == parts["idempotency"] == parts["limit"] == 0

    start_worker(lane, pool="threads", concurrency=8, extra=["-I", "tools.bench_tasks"])
    wait_until(lambda: rc.scard(keys.paused_workers(lane)) >= 1, timeout=30,
               what="the worker skipped the paused lane at start")
    assert rc.bitcount(mark_key(run)) == 0  # paused: nothing ran
    control.resume(lane, "test")
    wait_until(lambda: rc.bitcount(mark_key(run)) == N, timeout=120, interval=0.2, what="the backlog drained")
    wait_until(lambda: lane_depth(rc, lane) == 0 and int(rc.get(keys.lane_waiting(lane)) or 0) == 0,
               timeout=20, what="the lane emptied")
    assert int(rc.get(twice_key(run)) or 0) == 0

    # lanes.capacity's constants (manage.py capacity, docs/scaling.md) hold to this fresh measurement's
    # order of magnitude: bytes, commands and Redis CPU per task, filled and drained (the handler's own
    # two commands and the workers' idle polling counted in: hence a factor, not a figure).
    cost = capacity.PATHS["plain"]
    per_task_commands = (_commands(rc) - commands_before) / N
    per_task_cpu_us = (_redis_cpu_s(rc) - cpu_before) / N * 1e6
    assert cost.bytes_waiting / 2 <= report["bytes_per_task"] <= cost.bytes_waiting * 2, report
    assert cost.commands / 3 <= per_task_commands <= cost.commands * 3, per_task_commands
    assert cost.redis_cpu_us / 10 <= per_task_cpu_us <= cost.redis_cpu_us * 10, per_task_cpu_us


def _commands(rc) -> int:
    return sum(int(stat["calls"]) for stat in rc.info("commandstats").values())


def _redis_cpu_s(rc) -> float:
    info = rc.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def test_a_waiting_chat_scoped_task_fits_its_budget(rc):
    from tasks.cancel import cancel_chat
    from tools import memory

    name, lane, run = unique("backlog-chat"), unique("l-backlog-chat"), uuid.uuid4().hex[:8]
    define(name, lane=lane, timeout=600, chat_scoped=True, chat_queue_size=1000)
    chats = [f"c-{run}-{c}" for c in range(CHATS)]
    report = memory.measure(name, lane, [({"n": i}, {"chat_id": chats[i % CHATS]}) for i in range(N)])
    try:
        parts = report["parts"]
        assert report["parts_total"] <= BYTES_PER_WAITING_CHAT_TASK_BUDGET, parts
        assert parts["record"] > 0 and parts["chat queue"] > 0 and parts["deadlines"] > 0
        assert lane_depth(rc, lane) == CHATS  # only the heads are published
    finally:
        for chat in chats:
            cancel_chat(chat, "test over")
