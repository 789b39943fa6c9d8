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
                     queue_latency_s=0.0, process="t:1", liveness_ms=60_000).status == "run"
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


def test_a_rate_bucket_admits_its_burst_then_one_per_token(rc):
    lane = unique("ln")
    lim = limit(unique("rate"), scope="global", rate=5, burst=2)
    tt = limited_type(unique("ty"), [lim], lane)
    ids = [admit(tt.name, {"n": i}).task_id for i in range(4)]
    assert published(rc, ids) == [1, 1, 0, 0]
    base = keys.limit_base(lim.name)
    due = rc.zscore(keys.LIMIT_DUE, base)
    assert due and 0 < due - time.time() * 1000 <= 200 + 50  # one token in 1/5 s
    drain_limits()
    assert published(rc, ids) == [1, 1, 0, 0]  # not due yet: nothing moves
    time.sleep(0.25)
    drain_limits()
    assert published(rc, ids) == [1, 1, 1, 0]
    time.sleep(0.25)
    drain_limits()
    assert published(rc, ids) == [1, 1, 1, 1]
    total = rc.hgetall(keys.METRICS_TOTAL)
    assert int(total[f"lim_admitted|{lim.name}".encode()]) == 4
    assert int(total[f"lim_throttled|{lim.name}".encode()]) == 2
    assert not rc.exists(keys.lane_limited(lane))


def test_waiting_tasks_go_by_priority_then_first_come(rc):
    lane = unique("ln")
    lim = limit(unique("mif"), scope="global", max_in_flight=1)
    tt = limited_type(unique("ty"), [lim], lane)
    first = admit(tt.name, {}).task_id
    low = [admit(tt.name, {"n": i}, priority=2).task_id for i in range(2)]
    high = admit(tt.name, {}, priority=8).task_id
    order = []
    current = first
    for _ in range(4):
        run(current)
        current = next((t for t in [*low, high] if t not in order and published(rc, [t]) == [1]), None)
        if current is None:
            break
        order.append(current)
    assert order == [high, *low]


def test_a_chat_limit_keeps_chat_order_and_other_chats_go_on(rc):
    lane = unique("ln")
    lim = limit(unique("perchat"), scope="chat", rate=0.001, burst=1)  # one per chat, then a long wait
    tt = limited_type(unique("ty"), [lim], lane, chat_scoped=True)
    a = [admit(tt.name, {"n": i}, chat_id="a").task_id for i in range(2)]
    b = admit(tt.name, {}, chat_id="b").task_id
    assert published(rc, a, "a") == [1, 0] and published(rc, [b], "b") == [1]
    run(a[0], "a")
    # The next message of chat a is its head now, waiting on its chat's bucket (not published, not running).
    record = keys.task_record(a[1], "a")
    assert rc.hget(record, "st") == b"limited" and published(rc, a, "a") == [1, 0]
    assert rc.hget(record, "lw") == keys.limit_base(lim.name, "a").encode()
    assert rc.lindex(keys.chat_queue("a"), 0) == a[1].encode()
    assert admit(tt.name, {}).reason == "invalid_chat_id"


def test_a_task_with_two_limits_starts_only_when_both_admit(rc):
    lane = unique("ln")
    wide = limit(unique("wide"), scope="global", max_in_flight=3)
    per_key = limit(unique("perkey"), scope="key", max_in_flight=1)
    tt = limited_type(unique("ty"), [wide, per_key], lane)
    assert admit(tt.name, {}).reason == "invalid_limit_key"
    assert admit(tt.name, {}, limit_key="bad\nkey").reason == "invalid_limit_key"
    k1 = [admit(tt.name, {}, limit_key="k1").task_id for _ in range(2)]
    k2 = [admit(tt.name, {}, limit_key="k2").task_id for _ in range(2)]
    k3 = admit(tt.name, {}, limit_key="k3").task_id
    k4 = admit(tt.name, {}, limit_key="k4").task_id
    assert published(rc, [*k1, *k2, k3, k4]) == [1, 0, 1, 0, 1, 0]  # k4 waits on the global cap
    assert rc.hget(keys.task_record(k4), "lw") == keys.limit_base(wide.name).encode()
    # k1's finish frees a global slot and k1's key slot: k4 (first in the global queue) takes the
    # global one; k1's next passes its key but meets the full global cap and queues there.
    run(k1[0])
    assert published(rc, [k1[1], k4]) == [0, 1]
    assert rc.hget(keys.task_record(k1[1]), "lw") == keys.limit_base(wide.name).encode()
    run(k4)
    assert published(rc, [k1[1]]) == [1]


def test_retry_after_pauses_every_task_of_the_key(rc):
    from lanes.lua.retry import retry as lua_retry

    lane = unique("ln")
    lim = limit(unique("supplier"), scope="key", rate=100, burst=100)
    tt = limited_type(unique("ty"), [lim], lane)
    first = admit(tt.name, {}, limit_key="s1").task_id
    record = keys.task_record(first)
    now = time.time()
    assert lua_start(task_id=first, record=record, chat="", attempt=1, owner="t:1:1", now=now, lease_ms=6000,
                     max_deliveries=5, dead_owner="", metric_field="x|y", queue_latency_bucket="",
                     queue_latency_s=0.0, process="t:1", liveness_ms=60_000).status == "run"
    lua_retry(record=record, lane=lane, now=now, next_attempt=2, message=rc.hget(record, "msg").decode(),
              due=now + 1, queued_lease_ms=120000, metric_field="x|y", owner="t:1:1", retry_after_s=1.0)
    base = keys.limit_base(lim.name, "s1")
    assert rc.pttl(keys.limit_paused(base)) > 800
    assert not holders(rc, base)  # the parked retry gave its slot back
    later = admit(tt.name, {}, limit_key="s1").task_id
    other = admit(tt.name, {}, limit_key="s2").task_id
    assert published(rc, [later, other]) == [0, 1]  # the whole key waits, another key does not
    time.sleep(1.05)
    drain_limits()
    assert published(rc, [later]) == [1]


def test_the_audit_frees_a_leaked_slot_and_hands_it_on(rc):
    lane = unique("ln")
    lim = limit(unique("mif"), scope="global", max_in_flight=1)
    tt = limited_type(unique("ty"), [lim], lane)
    holder, waiter = (admit(tt.name, {}).task_id for _ in range(2))
    assert published(rc, [holder, waiter]) == [1, 0]
    rc.delete(keys.task_record(holder))  # its record vanished without a finish (data lost)
    for _ in range(20):  # the audit walks every instance of every limit, a batch per call
        freed = audit_limit_slots()
        if published(rc, [waiter]) == [1]:
            break
    assert published(rc, [waiter]) == [1], freed
    assert holders(rc, keys.limit_base(lim.name)) == {keys.task_record(waiter).encode()}


def test_an_admin_edit_of_a_limit_frees_waiting_tasks_at_once(rc):
    lane = unique("ln")
    lim = limit(unique("mif"), scope="global", max_in_flight=1)
    tt = limited_type(unique("ty"), [lim], lane)
    ids = [admit(tt.name, {}).task_id for _ in range(3)]
    assert published(rc, ids) == [1, 0, 0]
    lim.max_in_flight = 3
    lim.save()
    config.refresh_if_changed()  # any process's reload (the maintenance loop's, within its interval)
    drain_limits()
    assert published(rc, ids) == [1, 1, 1]


def test_fair_share_takes_keys_in_turn_by_weight(rc):
    lane = unique("ln")
    lim = limit(unique("share"), scope="key", fair_share=True, window=1, weights={"big": 2})
    tt = limited_type(unique("ty"), [lim], lane)
    big = [admit(tt.name, {}, limit_key="big").task_id for _ in range(10)]
    small = [admit(tt.name, {}, limit_key="small").task_id for _ in range(3)]
    by_id = {**{t: "big" for t in big}, **{t: "small" for t in small}}
    served = []
    running = big[0]
    for _ in range(9):
        run(running)
        running = next(t for t in [*big, *small] if t not in served and t != big[0]
                       and published(rc, [t]) == [1])
        served.append(running)
    # big's first ran alone (window 1); then turns in ring order: big 2 (its weight), small 1, ...
    assert [by_id[t] for t in served] == ["big", "big", "small", "big", "big", "small", "big", "big", "small"]


#: Commands Redis runs for an unlimited task's admission, claim and finish (measured on main before
#: limits existed, with this same test's MONITOR count): limits must add none.
#: Issue 17 added 2 to the claim (the process joins the live set, the record its held set): 53.
#: Issue 16's budget: 17 (admit 6, start 8, finish 3; no LLENs, counters kept in process, the
#: lane's estimate inputs read at most once a second per process, no settle lease for a claimed task).
#: Issue 17's doorbells: admission rings the lane's doorbell, here one LINDEX (the warm-up's ring left
#: a token naming the list; an LPUSH or LSET only when there is none or it lacks the list): 18.
#: Admission rings only onto an empty list (rings_for): the warm-up's message is still in the list,
#: so this push rings nothing: 17.
#: Admission writes no queued lease (the pop that takes the message does, pop_more.lua; here start.lua claims
#: the record without a pop): 16.
UNLIMITED_PATH_COMMANDS = 16


def test_an_unlimited_type_pays_no_redis_command_for_limits(rc, redis_server, monkeypatch):
    import threading

    from lanes.lua import admit as admit_wrapper

    monkeypatch.setattr(admit_wrapper, "ESTIMATE_INPUTS_TTL_S", 600)  # the warm-up's reading serves the count
    lane = unique("ln")
    rc.zadd(keys.lane_consumers(lane), {"w@test": int(time.time() * 1000) + 60_000})  # a serving lane
    tt = define(unique("ty"), lane=lane)
    config.forget()
    admit(tt.name, {"warm": 1})  # the config is loaded (and its definitions written) before counting
    seen: list[str] = []
    monitor_client = redis_server.client()
    ready = threading.Event()

    def watch() -> None:
        with monitor_client.monitor() as m:
            ready.set()
            for event in m.listen():
                seen.append(event["command"])
                if "STOP-MONITOR" in event["command"]:
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.2)
    task_id = admit(tt.name, {}).task_id
    run(task_id)
    rc.echo("STOP-MONITOR")
    thread.join(10)
    # TTL/EXPIRE of a metrics minute hash run only on its first count of a minute: not counted.
    # Since issue 16 the counters are written in batches by a thread of their own (lanes.counters):
    # those writes (dispatch:m:...) are not this path's.
    # Other processes of a test session (workers' beats and maintenance loops) may run commands
    # meanwhile: only what names this task, its lane, or the claim's own keys is this path's.
    script_cmds = [c for c in seen if not c.startswith(("EVALSHA", "EVAL ", "ECHO", "TTL ", "EXPIRE ", "HELLO "))
                   and " dispatch:m:" not in c
                   and (task_id in c or lane in c or c in ("GET dispatch:config:version",)
                        or c.startswith("ZADD dispatch:procs NX"))]
    assert not [c for c in script_cmds if "dispatch:lim:" in c]
    assert not [c for c in script_cmds if ":limited" in c]  # the depth is the lane's waiting count (issue 16)
    # The claim leaves the lane's waiting count with the other claims of its call (DECRBY, _claim.lua).
    assert [c.split()[0] for c in script_cmds if c.split()[1].endswith(":waiting")] == ["INCR", "DECRBY"]
    assert [c for c in script_cmds if ":bell" in c] == [], script_cmds  # onto a list holding the warm-up's
    assert len(script_cmds) == UNLIMITED_PATH_COMMANDS, script_cmds


def test_estimated_delay_counts_the_turn_a_rate_limit_gives(rc):
    """A task a 2/s limit holds, with n waiting before it, should start in about (n + 1) / 2 s."""
    lane = unique("ln")
    lim = limit(unique("est"), scope="global", rate=2, burst=1)
    tt = limited_type(unique("ty"), [lim], lane)
    rc.zadd(keys.lane_consumers(lane), {"w@test": int(time.time() * 1000) + 60_000})  # a live consumer
    results = [admit(tt.name, {"n": i}) for i in range(4)]
    assert all(r.accepted for r in results), results
    # The first took the one token (an idle lane: no wait); the others wait their turn on the limit.
    assert results[0].estimated_delay == 0.0
    waits = [r.estimated_delay for r in results[1:]]
    assert all(w is not None for w in waits), results
    for n, seconds in enumerate(waits):
        assert abs(seconds - (n + 1) / 2) < 0.01, (n, waits)


def test_an_overdue_retry_goes_through_the_gate_not_around_it(rc):
    """The sweep used to republish a retry whose lease ran out (maintenance away past its due
    time plus the queued lease) straight onto the lane, past a full in-flight cap."""
    from lanes.lua.retry import retry as lua_retry
    from lanes.lua.sweep import sweep as lua_sweep
    from tasks.maintenance import promote_due

    lane = unique("ln")
    lim = limit(unique("mif"), scope="global", max_in_flight=1)
    tt = limited_type(unique("ty"), [lim], lane)
    first = admit(tt.name, {}).task_id
    record = keys.task_record(first)
    now = time.time()
    assert lua_start(task_id=first, record=record, chat="", attempt=1, owner="t:1:1", now=now, lease_ms=6000,
                     max_deliveries=5, dead_owner="", metric_field="x|y", queue_latency_bucket="",
                     queue_latency_s=0.0, process="t:1", liveness_ms=60_000).status == "run"
    lua_retry(record=record, lane=lane, now=now, next_attempt=2, message=rc.hget(record, "msg").decode(),
              due=now, queued_lease_ms=120000, metric_field="x|y", owner="t:1:1", retry_after_s=0.0)
    holder = admit(tt.name, {}).task_id  # takes the slot the parked retry gave back
    base = keys.limit_base(lim.name)
    assert holders(rc, base) == {keys.task_record(holder).encode()}
    rc.zadd(keys.LEASES, {record: int(now * 1000) - 1})  # its lease ran out before promotion moved it
    lua_sweep(now_ms=int(time.time() * 1000), batch=100, queued_lease_ms=120000)
    promote_due()
    assert published(rc, [first]) == [1]  # not published again while the cap is full
    assert rc.hget(record, "st") == b"limited"
    assert holders(rc, base) == {keys.task_record(holder).encode()}
    run(holder)  # the slot comes back: the retry passes the gate now
    assert published(rc, [first]) == [2]
