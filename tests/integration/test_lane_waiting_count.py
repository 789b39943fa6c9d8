"""The lane's waiting count (admission's depth since issue 16) moves with the deadlines set, and nothing else.

Every accepted task that no worker has claimed is in ``keys.DEADLINES``; the
scripts keep ``keys.lane_waiting(lane)`` equal to how many of them are the
lane's (_lib.lua ``waiting_add`` / ``waiting_remove``). These runs go through
every script that changes the set: admission (plain, chat heads and the
messages behind them, rejections), the claim, retries, finishes, expiry, a
cancel (queued, sent for later, behind its chat's head, waiting on a limit)
and a batched claim (claim_batch.lua).
"""

from __future__ import annotations

import time

from lanes import keys
from lanes.lua.claim_batch import claim_batch
from lanes.messages import listed_message
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until


def waiting(rc, lane: str) -> int:
    return int(rc.get(keys.lane_waiting(lane)) or 0)


def in_deadlines(rc, lane: str) -> int:
    """The lane's records in the deadlines set, counted the slow way (the truth the count stands for)."""
    members = rc.zrange(keys.DEADLINES, 0, -1)
    return sum(1 for record in members if rc.hget(record, "lane") == lane.encode())


def test_the_count_is_the_lane_depth_and_capacity_holds(rc):
    lane = unique("wc-full")
    name, chat_name = unique("wc-echo"), unique("wc-chat")
    define(name, lane=lane, capacity=4)
    define(chat_name, lane=lane, capacity=4, chat_scoped=True, chat_queue_size=8)
    chat = unique("c")
    first = [dispatch.delay(chat_name, {"n": n}, chat_id=chat) for n in range(2)]  # a head and one behind it
    plain = [dispatch.delay(name, {"i": i}) for i in range(4)]
    assert [r.accepted for r in first + plain] == [True, True, True, True, False, False]
    assert {r.reason for r in plain[2:]} == {"lane_full"}
    assert waiting(rc, lane) == in_deadlines(rc, lane) == 4
    assert plain[1].position == 4  # the depth before it (three waiting) plus itself


def test_the_count_goes_back_to_zero_through_claims_retries_and_expiry(rc, start_worker):
    lane, idle_lane = unique("wc-run"), unique("wc-idle")
    echo, flaky, chat_name = unique("wc-echo"), unique("wc-flaky"), unique("wc-chat")
    late = unique("wc-late")
    define(echo, lane=lane)
    define(flaky, handler="demo.flaky", lane=lane, policy={"initial_backoff": 0.05, "jitter": 0})
    define(chat_name, lane=lane, chat_scoped=True, chat_queue_size=16)
    define(late, lane=idle_lane, timeout=1, attempt_timeout=1)
    results = [dispatch.delay(echo, {"i": i}) for i in range(5)]
    results += [dispatch.delay(flaky, {"fail": "retry", "fail_times": 2, "i": i}) for i in range(3)]
    chat = unique("c")
    results += [dispatch.delay(chat_name, {"n": n}, chat_id=chat) for n in range(4)]
    expiring = [dispatch.delay(late, {"i": i}) for i in range(3)]  # no worker takes this lane
    assert all(r.accepted for r in results + expiring)
    assert waiting(rc, lane) == in_deadlines(rc, lane) == 12
    assert waiting(rc, idle_lane) == 3

    start_worker(lane, concurrency=2)  # its maintenance loop expires the idle lane's tasks too
    for r in results:
        r.get(timeout=60)
    wait_until(lambda: waiting(rc, idle_lane) == 0, timeout=30, what="the idle lane's tasks expired")
    time.sleep(0.5)
    assert waiting(rc, lane) == in_deadlines(rc, lane) == 0
    assert in_deadlines(rc, idle_lane) == 0


def test_a_cancelled_waiting_task_leaves_the_count(rc):
    from tests.integration.test_limits_scripts import limit, limited_type

    lane = unique("wc-cancel")
    name, chat_name = unique("wc-echo"), unique("wc-chat")
    define(name, lane=lane, timeout=600)
    define(chat_name, lane=lane, chat_scoped=True, chat_queue_size=8, timeout=600)
    lim = limit(unique("wc-lim"), scope="global", max_in_flight=1)
    limited = limited_type(unique("wc-limited"), [lim], lane, timeout=600).name
    queued = dispatch.delay(name, {"n": 0})
    later = dispatch.delay(name, {"n": 1}, countdown=300)  # in the lane's delayed set
    chat = unique("c")
    head, behind, behind_later = (dispatch.delay(chat_name, {"n": n}, chat_id=chat, countdown=300 if n == 2 else None)
                                  for n in range(3))
    holder, waits = (dispatch.delay(limited, {"n": n}) for n in range(2))  # the second waits on the limit
    every = [queued, later, head, behind, behind_later, holder, waits]
    assert all(r.accepted for r in every)
    assert rc.hget(keys.task_record(waits.task_id), "st") == b"limited"
    assert waiting(rc, lane) == in_deadlines(rc, lane) == 7
    left = 7
    for r in (queued, later, behind_later, behind, waits, head, holder):
        assert r.cancel("not wanted").outcome == "cancelled"
        left -= 1
        assert waiting(rc, lane) == in_deadlines(rc, lane) == left, r.task_id


def test_a_batched_claim_takes_its_tasks_out_of_the_count(rc):
    lane = unique("wc-batch")
    name = unique("wc-bt")
    define(name, handler="demo.echo_batch", lane=lane, batch_size=10, batch_window_ms=0)
    results = [dispatch.delay(name, {"i": i}) for i in range(6)]
    assert all(r.accepted for r in results)
    assert waiting(rc, lane) == in_deadlines(rc, lane) == 6
    handler = next(listed_message(rc, m)["headers"]["task"] for q in keys.lane_queues(lane) for m in rc.lrange(q, 0, 0))
    now = time.time()
    taken = claim_batch(
        lane=lane, handler=handler, task_type=name, owner="wc-test:1:1", now=now, lease_ms=60_000,
        max_deliveries=5, most=4, metric_field=f"{lane}|{name}", process="wc-test:1", liveness_ms=0,
    )
    assert len(taken.messages) == 4
    assert waiting(rc, lane) == in_deadlines(rc, lane) == 2
    rest = claim_batch(
        lane=lane, handler=handler, task_type=name, owner="wc-test:1:1", now=now, lease_ms=60_000,
        max_deliveries=5, most=10, metric_field=f"{lane}|{name}", process="wc-test:1", liveness_ms=0,
    )
    assert len(rest.messages) == 2
    assert waiting(rc, lane) == in_deadlines(rc, lane) == 0
    rc.delete(keys.process_held("wc-test:1"))
