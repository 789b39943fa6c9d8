"""Scenario 12: limits under faults: workers killed while their tasks hold slots, Redis frozen.

A chat-scoped ``http.post`` type with two limits (a global cap of running
tasks with a rate, and a per-chat rate), constant load above what the limits
admit, so tasks wait in Redis the whole time. Meanwhile worker processes are
SIGKILLed while their tasks hold slots, and Redis is frozen (SIGSTOP) for a few
seconds. Afterwards: nothing lost, no duplicate effect, no order violation, the
cap held, and **no leaked slot**: every holding set (``B:f``), instance index
and lane counter of the limits is gone.
"""

from __future__ import annotations

import time

from lanes import keys
from tests.faults.harness import drain_and_check, long_only, pick
from tests.support.helpers import unique

CAP = 6


def _limits(cluster, type_name: str) -> list[str]:
    """A global cap + rate and a per-chat rate on ``type_name``; the processes see them at their next call."""
    from tasks.models import Limit, TaskType, TaskTypeLimit

    made = []
    for i, fields in enumerate(({"scope": "global", "max_in_flight": CAP, "rate": 30, "burst": 10},
                                {"scope": "chat", "rate": 2, "burst": 2})):
        lim = Limit(name=unique("fl-lim"), **fields)
        lim.full_clean()
        lim.save()
        TaskTypeLimit.objects.create(task_type=TaskType.objects.get(name=type_name), limit=lim, position=i)
        made.append(lim.name)
    cluster.client().incr(keys.CONFIG_VERSION)
    return made


def _limit_residue(client, names: list[str], lane: str) -> dict[str, int]:
    """Slots still held, instances still indexed, tasks still counted as waiting on a limit."""
    holding = [k for name in names for k in client.scan_iter(keys.limit_base(name, "*") + ":f", count=1000)]
    return {k: v for k, v in {
        "held_slots": sum(client.scard(k) for k in holding),
        "waiting": sum(client.zcard(k) for name in names
                       for k in client.scan_iter(keys.limit_base(name, "*") + ":w", count=1000)),
        "indexed_instances": sum(client.zcard(keys.limit_instances(name)) for name in names),
        "lane_limited": int(client.get(keys.lane_limited(lane)) or 0),
    }.items() if v}


def _max_running(sink) -> int:
    with sink.lock:
        edges = sorted([(a.started, 1) for a in sink.attempts] + [(a.at, -1) for a in sink.attempts])
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


@long_only("tests/integration/test_limits_workers.py kills a worker holding slots here")
def test_12_limits_kill_workers_holding_slots_and_freeze_redis(cluster_factory, record):
    started = time.time()
    cluster = cluster_factory(env={"DISPATCH_REDIS_TIMEOUT_S": "3"})
    lane = unique("fl-lim")
    name = cluster.http_type(lane)
    names = _limits(cluster, name)
    cluster.sink.sink.behaviour.delay_s = (0.1, 0.3)  # slots are held long enough to be killed holding them
    workers = [cluster.worker(lane, concurrency=3), cluster.worker(lane, pool="threads", concurrency=4)]
    duration = pick(16, 45)
    load = cluster.constant_load(name, rate=pick(25, 40), duration=duration, chats=pick(24, 48))
    client = cluster.client()
    faults: dict[str, list] = {"killed_holding": [], "frozen_s": []}

    def kill_one(index: int, pool: str, concurrency: int) -> None:
        held = sum(client.scard(k) for k in client.scan_iter(keys.limit_base(names[0], "*") + ":f"))
        faults["killed_holding"].append(held)
        cluster.kill_main(workers[index])
        time.sleep(0.5)
        cluster.reap(workers[index])
        workers[index] = cluster.worker(lane, pool=pool, concurrency=concurrency)

    time.sleep(duration * 0.25)
    kill_one(0, "prefork", 3)
    time.sleep(duration * 0.2)
    pause = pick(3.0, 6.0)
    cluster.redis_pause()
    time.sleep(pause)
    cluster.redis_resume()
    faults["frozen_s"].append(pause)
    time.sleep(duration * 0.15)
    kill_one(1, "threads", 4)
    load.wait(timeout=duration + 120)
    rep = drain_and_check(cluster, [load], scenario="12 limits: kill holders, freeze Redis",
                          drain_bound=pick(120, 180), lanes=[lane])
    deadline = time.time() + 30
    while _limit_residue(client, names, lane) and time.time() < deadline:
        time.sleep(0.5)  # a finished task's release is in its finish call; the audit frees what a crash left
    leaked = _limit_residue(client, names, lane)
    rep.extra["limits"] = {"killed_while_holding_slots": faults["killed_holding"], "redis_frozen_s": pause,
                           "most_running_at_once": _max_running(cluster.sink.sink), "cap": CAP,
                           "leaked": leaked or 0}
    record("12-limits-faults", rep, started)
    assert rep.accepted > 0 and rep.accounted, rep.summary()
    assert rep.lost == rep.duplicate_effects == rep.order_violations == rep.stuck == 0, rep.summary()
    assert any(faults["killed_holding"]), "no worker was killed while its tasks held slots"
    assert not leaked, leaked
