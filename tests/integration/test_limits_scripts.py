"""Limits in the scripts alone (no worker): the gate, release, due drain, Retry-After, audit, fair share."""

from __future__ import annotations

import time

from lanes import keys
from lanes.lua.finish import finish as lua_finish
from lanes.lua.start import start as lua_start
from tasks import config
from tasks.dispatch import admit
from tasks.maintenance import audit_limit_slots, drain_limits
from tests.support.helpers import define, lane_depth, unique

def limit(name: str, **fields):
    from tasks.models import Limit

    obj, _ = Limit.objects.update_or_create(name=name, defaults=fields)
    obj.full_clean()
    return obj


def limited_type(name: str, limits: list, lane: str, **fields):
    from tasks.models import TaskTypeLimit

    tt = define(name, lane=lane, **fields)
    TaskTypeLimit.objects.filter(task_type=tt).delete()
    for i, lim in enumerate(limits):
        TaskTypeLimit.objects.create(task_type=tt, limit=lim, position=i)
    config.forget()
    return tt


def holders(rc, base: str) -> set[bytes]:
    return rc.smembers(keys.limit_holding(base))


def published(rc, ids: list[str], chat: str = "") -> list[int]:
    return [int(rc.hget(keys.task_record(i, chat or None), "pub") or 0) for i in ids]


def run(task_id: str, chat: str = "") -> None:
    """Claim and finish a published task the way a worker does (start.lua, finish.lua)."""
    record = keys.task_record(task_id, chat or None)
    now = time.time()
    assert lua_start(task_id=task_id, record=record, chat=chat, attempt=1, owner="t:1:1", now=now, lease_ms=6000,
                     max_deliveries=5, dead_owner="", metric_field="x|y", queue_latency_bucket="",
                     queue_latency_s=0.0)[0] == b"run"
    lua_finish(task_id=task_id, record=record, chat=chat, outcome="done", result_json="null", now=now,
               tombstone_ttl_s=60, queued_lease_ms=120000, metric_field="x|y", reason="",
               execution_latency_bucket="", execution_latency_s=0.0, owner="t:1:1", settle_lease_ms=6000)


def test_max_in_flight_holds_the_rest_and_a_finish_hands_the_slot_on(rc):
    lane = unique("ln")
    lim = limit(unique("mif"), scope="global", max_in_flight=2)
    tt = limited_type(unique("ty"), [lim], lane)
    ids = [admit(tt.name, {"n": i}).task_id for i in range(5)]
    base = keys.limit_base(lim.name)
    assert lane_depth(rc, lane) == 2
    assert int(rc.get(keys.lane_limited(lane))) == 3
    assert rc.zcard(keys.limit_waiting(base)) == 3
    assert rc.zscore(keys.limit_instances(lim.name), base) == 5
    # The first two hold the slots; finishing one publishes the next in the same call.
    run(ids[0])
    assert published(rc, ids) == [1, 1, 1, 0, 0]
    assert int(rc.get(keys.lane_limited(lane))) == 2
    assert keys.task_record(ids[2]).encode() in holders(rc, base)
    assert rc.hget(keys.task_record(ids[3]), "st") == b"limited"
    assert not rc.zscore(keys.LEASES, keys.task_record(ids[3]))
    run(ids[1])
    run(ids[2])
    assert published(rc, ids) == [1, 1, 1, 1, 1]
    assert not rc.exists(keys.lane_limited(lane), keys.limit_waiting(base))
    run(ids[3])
    run(ids[4])
    # An idle limit leaves nothing behind.
    assert not rc.exists(keys.limit_holding(base), keys.limit_instances(lim.name))
