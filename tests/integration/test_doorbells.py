"""Lane doorbells (docs/liveness.md): a worker pops a lane's messages only in the script that
names each in its in-hand set, so a worker killed at any moment leaves every message it took
either in its list or in its set; every push onto a lane list rings the lane's doorbell."""

from __future__ import annotations

import json
import threading
import uuid

from django_celery_results.models import TaskResult
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lanes import keys, leases
from lanes.lua.pop_more import pop_more
from lanes.priorities import to_kombu
from tasks.bulk import dispatch_many
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until

#: Commands that take an element off a list (what a pop outside a script would be).
POPS = {"BRPOP", "RPOP", "LPOP", "BLPOP", "RPOPLPUSH", "BRPOPLPUSH", "LMOVE", "BLMOVE", "LMPOP", "BLMPOP"}
TASKS = 300


def _bell_bits(rc, lane: str) -> list[int]:
    return [int(t) for t in rc.lrange(keys.lane_doorbell(lane), 0, -1)]


def test_a_worker_pops_lane_lists_only_inside_a_script(rc, start_worker):
    """MONITOR while a real worker drains a few hundred tasks: no command from a client takes a
    message off a lane list (before: its BRPOP named the lane's ten lists, and the message it
    returned was in no in-hand set until the lease thread's SADD)."""
    lane, type_name = unique("bell"), unique("bell-echo")
    define(type_name, lane=lane)
    lists = set(keys.lane_queues(lane))
    seen: list[dict] = []
    marker = f"monitor-stop-{uuid.uuid4().hex}"
    ready = threading.Event()

    def watch() -> None:
        with rc.monitor() as m:
            ready.set()
            for command in m.listen():
                if marker in command["command"]:
                    return
                seen.append(command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(10)
    start_worker(lane, pool="threads", concurrency=8)
    ids = []
    for i in range(TASKS):
        result = dispatch.delay(type_name, {"i": i}, priority=i % 10)
        assert result.accepted, result
        ids.append(result.task_id)
    wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == TASKS,
               timeout=120, what=f"{TASKS} results stored")
    rc.echo(marker)
    thread.join(timeout=30)
    assert not thread.is_alive()
    outside = [c for c in seen if c["client_type"] != "lua" and c["command"].split(" ", 1)[0].upper() in POPS
               and lists & set(c["command"].split(" ")[1:])]
    assert not outside, [c["command"][:160] for c in outside[:5]]
    bell = keys.lane_doorbell(lane)
    waits = [c for c in seen if c["client_type"] != "lua" and c["command"].startswith("BRPOP ")
             and bell in c["command"].split(" ")]
    taken = [c for c in seen if c["client_type"] == "lua" and c["command"].startswith("RPOP ")
             and c["command"].split(" ")[1] in lists]
    assert waits and taken  # the worker waited on the doorbell and took the messages in the script


def _message(record: str) -> bytes:
    # The fields pop_more.lua reads, as lanes/messages.py writes them (compact JSON).
    return json.dumps({"headers": {"dispatch_leased": True, "dispatch_record": record}},
                      separators=(",", ":")).encode()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(0, 4), min_size=10, max_size=10), room=st.integers(1, 12),
       bits=st.one_of(st.none(), st.integers(0, 1023)))
def test_a_pop_names_every_record_it_took_and_rings_again_for_what_it_left(rc, counts, room, bits):
    lane = unique("bellpop")
    lists = keys.lane_queues(lane)
    in_hand = keys.process_in_hand(leases.process_id())
    rc.delete(in_hand)
    for p, n in enumerate(counts):
        for i in range(n):
            rc.lpush(lists[p], _message(f"{lane}:{p}:{i}"))
    popped = pop_more(rc, lane, lists, room, bits)
    looked = [p for p in range(10) if bits is None or bits >> p & 1]
    # Highest priority first, each list from its oldest end, at most the room.
    expected = [f"{lane}:{p}:{i}" for p in looked for i in range(counts[p])][:room]
    assert [record for _item, record in popped] == expected
    assert [json.loads(item)["headers"]["dispatch_record"] for item, _record in popped] == expected
    # Every record it took is in the in-hand set, written by the same call.
    assert {m.decode() for m in rc.smembers(in_hand)} == set(expected)
    # Nothing lost: what it did not take is still in its list.
    left = [rc.llen(name) for name in lists]
    assert sum(left) + len(popped) == sum(counts)
    # A list it was told to look at and left messages in is named by the doorbell (chain wake).
    token = _bell_bits(rc, lane)
    assert len(token) <= 1
    for p in looked:
        if left[p]:
            assert token and token[0] >> p & 1, (p, left, token)
    rc.delete(in_hand, keys.lane_doorbell(lane), *lists)


def test_every_platform_push_rings_the_lanes_doorbell_once(rc):
    lane, type_name = unique("bellring"), unique("bellring-echo")
    define(type_name, lane=lane)
    assert _bell_bits(rc, lane) == []
    assert dispatch.delay(type_name, {"i": 0}, priority=9).accepted
    assert _bell_bits(rc, lane) == [1 << to_kombu(9)]
    assert dispatch.delay(type_name, {"i": 1}, priority=4).accepted
    assert dispatch.delay(type_name, {"i": 2}, priority=4).accepted
    assert _bell_bits(rc, lane) == [1 << to_kombu(9) | 1 << to_kombu(4)]  # one token, both lists
    rc.delete(keys.lane_doorbell(lane))
    results = dispatch_many(type_name, [{"i": i} for i in range(50)])
    assert all(r.accepted for r in results)
    assert _bell_bits(rc, lane) == [1 << to_kombu(5)]  # the type's default priority, rung once


def test_a_message_that_did_not_ring_is_taken_within_the_workers_poll(rc, start_worker):
    """A message on a lane list with no token (a producer that does not ring, a token lost with a
    killed worker): the worker's BRPOP on the doorbell times out (about a second) and it looks at
    every list of its lanes anyway."""
    lane, type_name = unique("bellpoll"), unique("bellpoll-echo")
    define(type_name, lane=lane)
    result = dispatch.delay(type_name, {"poll": True})
    assert result.accepted
    rc.delete(keys.lane_doorbell(lane))  # as if a producer that does not know doorbells had pushed it
    start_worker(lane, pool="threads", concurrency=2)
    assert result.get(timeout=30) is not None
    assert rc.llen(keys.lane_doorbell(lane)) == 0
