"""Lane doorbells (docs/liveness.md): a worker pops a lane's messages only in the script that
names each in its in-hand set, so a worker killed at any moment leaves every message it took
either in its list or in its set; every push onto a lane list rings the lane's doorbell."""

from __future__ import annotations

import json
import threading
import time
import uuid

from django_celery_results.models import TaskResult
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Connection, Exchange, Queue

from lanes import keys, leases
from lanes.lua.pop_more import pop_more
from lanes.priorities import to_kombu
from lanes.transport import LEASED_HEADER, RECORD_HEADER
from tasks.bulk import dispatch_many
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique, wait_until

#: Commands that take an element off a list (what a pop outside a script would be).
POPS = {"BRPOP", "RPOP", "LPOP", "BLPOP", "RPOPLPUSH", "BRPOPLPUSH", "LMOVE", "BLMOVE", "LMPOP", "BLMPOP"}
TASKS = 300


def _bell_bits(rc, lane: str) -> list[int]:
    return [int(t) for t in rc.lrange(keys.lane_doorbell(lane), 0, -1)]


class Monitor:
    """Every command Redis runs while in the ``with`` block (``MONITOR``), as redis-py parses them."""

    def __init__(self, rc) -> None:
        # Its own client with no read timeout: a MONITOR that waits longer than the pool's timeout for a
        # command (a worker still booting on a loaded host) would end, seeing nothing from then on.
        import redis

        pool = redis.ConnectionPool(connection_class=rc.connection_pool.connection_class,
                                    **{**rc.connection_pool.connection_kwargs, "socket_timeout": None})
        self.rc = redis.Redis(connection_pool=pool)
        self.seen: list[dict] = []
        self.marker = f"monitor-stop-{uuid.uuid4().hex}"
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.ready = threading.Event()

    def _watch(self) -> None:
        with self.rc.monitor() as m:
            self.ready.set()
            for command in m.listen():
                if self.marker in command["command"]:
                    return
                self.seen.append(command)

    def __enter__(self) -> Monitor:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.rc.echo(self.marker)
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()

    def pops_outside_scripts(self, lane: str) -> list[str]:
        """Commands from a client (not a script) that take a message off one of ``lane``'s lists."""
        lists = set(keys.lane_queues(lane))
        return [c["command"][:160] for c in self.seen
                if c["client_type"] != "lua" and c["command"].split(" ", 1)[0].upper() in POPS
                and lists & set(c["command"].split(" ")[1:])]


def test_a_worker_pops_lane_lists_only_inside_a_script(rc, start_worker):
    """MONITOR while a real worker drains a few hundred tasks: no command from a client takes a
    message off a lane list (before: its BRPOP named the lane's ten lists, and the message it
    returned was in no in-hand set until the lease thread's SADD)."""
    lane, type_name = unique("bell"), unique("bell-echo")
    define(type_name, lane=lane)
    lists = set(keys.lane_queues(lane))
    with Monitor(rc) as monitor:
        start_worker(lane, pool="threads", concurrency=8)
        ids = []
        for i in range(TASKS):
            result = dispatch.delay(type_name, {"i": i}, priority=i % 10)
            assert result.accepted, result
            ids.append(result.task_id)
        wait_until(lambda: TaskResult.objects.filter(task_id__in=ids, status="SUCCESS").count() == TASKS,
                   timeout=120, what=f"{TASKS} results stored")
    assert not monitor.pops_outside_scripts(lane), monitor.pops_outside_scripts(lane)[:5]
    seen = monitor.seen
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
    assert [p.record for p in popped] == expected
    assert [json.loads(p.message)["headers"]["dispatch_record"] for p in popped] == expected
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


def test_a_synchronous_get_of_a_lane_pops_inside_the_script_and_a_publish_rings(redis_server, rc):
    """kombu's ``Queue.get`` (basic_get) of a lane takes its message with POP_MORE too, naming its
    record in the in-hand set; a message published or handed back through the transport rings."""
    lane = unique("bellget")
    record = keys.task_record(unique("t"))
    in_hand = keys.process_in_hand(leases.process_id())
    with Connection(redis_server.url, transport="lanes.transport:Transport") as conn:
        channel = conn.channel()
        queue = Queue(lane, Exchange(lane, type="direct"), routing_key=lane, channel=channel)
        queue.declare()
        conn.Producer(channel=channel).publish({"n": 1}, exchange=queue.exchange, routing_key=lane,
                                               serializer="json", priority=0,
                                               headers={LEASED_HEADER: True, RECORD_HEADER: record})
        assert _bell_bits(rc, lane) == [1]  # kombu priority 0: the lane's first list
        rc.delete(keys.lane_doorbell(lane))
        with Monitor(rc) as monitor:
            message = queue.get(no_ack=False)
        assert message is not None and message.payload == {"n": 1}
        assert not monitor.pops_outside_scripts(lane), monitor.pops_outside_scripts(lane)
        assert rc.sismember(in_hand, record)
        message.reject(requeue=True)  # handed back from memory
        assert _bell_bits(rc, lane) == [1] and rc.llen(lane) == 1
    rc.delete(lane, keys.lane_doorbell(lane), in_hand)


def _script_runs(seen: list[dict]) -> list[list[str]]:
    """The commands each script ran (MONITOR shows them together, apart from any client's), by name."""
    runs: list[list[str]] = []
    inside = False
    for entry in seen:
        if entry["client_type"] == "lua":
            if not inside:
                runs.append([])
            runs[-1].append(entry["command"])
        inside = entry["client_type"] == "lua"
    return runs


def test_a_push_onto_a_lane_list_that_holds_messages_does_not_ring(rc):
    """Admission rings only for a list that was empty: the oldest message there rang, and until the
    list is empty a token or a pop names it (_lib.lua's rings_for). Counted inside the script, a
    plain dispatch onto a backlog runs five commands and no LINDEX of the doorbell; onto an empty
    list it rings as before."""
    lane, type_name = unique("bellbacklog"), unique("bellbacklog-echo")
    define(type_name, lane=lane)
    rc.zadd(keys.lane_consumers(lane), {"w@test": int(time.time() * 1000) + 60_000})  # a live consumer
    lists = set(keys.lane_queues(lane))
    with Monitor(rc) as monitor:
        results = [dispatch.delay(type_name, {"i": i}) for i in range(20)]
    assert all(r.accepted for r in results)
    ours = [[c.split(" ")[0].upper() for c in run] for run in _script_runs(monitor.seen)
            if any(c.split(" ")[0].upper() == "LPUSH" and set(c.split(" ")[1:2]) & lists for c in run)]
    assert len(ours) == 20, ours
    # An empty list: rung, with one LPUSH of the token and no LINDEX (the push's reply says the bell was empty).
    assert "LINDEX" not in ours[0] and ours[0].count("LPUSH") == 2, ours[0]
    estimate = {"HMGET", "SISMEMBER", "ZCOUNT"}  # the lane's estimate inputs, read once a second at most
    for run in ours[1:]:
        # No queued lease's ZADD since 2026-12-02 (the pop writes it: pop_more.lua): five, and the EVALSHA.
        assert [name for name in run if name not in estimate] == ["GET", "INCR", "HSET", "ZADD", "LPUSH"], run
    assert _bell_bits(rc, lane) == [1 << to_kombu(results[0].priority)]
    rc.delete(*lists, keys.lane_doorbell(lane), keys.lane_consumers(lane))


def test_a_promoted_task_rings_only_onto_an_empty_list(rc):
    """publish_record (promote, hand-over, sweep, reclaim) rings by the same rule as admission: a task
    sent for later and now due is pushed without touching the doorbell when its list holds messages,
    and rings when its list was empty."""
    from tasks.maintenance import promote_due

    lane, type_name = unique("bellpromote"), unique("bellpromote-echo")
    define(type_name, lane=lane)
    lists = set(keys.lane_queues(lane))
    bell = keys.lane_doorbell(lane)

    def promote_runs() -> list[list[str]]:
        with Monitor(rc) as monitor:
            assert promote_due([lane]) == 1
        return [run for run in _script_runs(monitor.seen)
                if any(c.split(" ")[0].upper() == "LPUSH" and set(c.split(" ")[1:2]) & lists for c in run)]

    later = dispatch.delay(type_name, {"later": 1}, countdown=0.05)
    assert later.accepted and rc.llen(bell) == 0
    time.sleep(0.1)
    runs = promote_runs()
    assert len(runs) == 1 and [c.split(" ")[0].upper() for c in runs[0] if bell in c] == ["LPUSH"], runs
    assert rc.llen(bell) == 1  # onto an empty list: rung

    assert dispatch.delay(type_name, {"now": 1}).accepted  # the list holds messages now
    later = dispatch.delay(type_name, {"later": 2}, countdown=0.05)
    assert later.accepted
    rc.delete(bell)
    time.sleep(0.1)
    runs = promote_runs()
    assert len(runs) == 1 and not any(bell in c for c in runs[0]), runs  # no LINDEX, no LPUSH of a token
    assert rc.llen(bell) == 0
    rc.delete(*lists, bell)


def test_a_ring_costs_one_command_when_the_bell_is_empty_and_always_leaves_one_token(rc):
    """_lib.lua's ring pushes first and reads the push's reply: onto an empty bell (an idle worker blocks on
    it, a busy one took the token) that LPUSH is the whole ring (an LINDEX and an LPUSH before); onto a bell
    holding a token it takes that token back (RPOP) and writes the two merged (LSET), in the same script, so a
    worker never sees two tokens and the token names every list rung."""
    from lanes.lua.ring import ring

    lane = unique("bellcost")
    bell = keys.lane_doorbell(lane)

    def ring_commands(bits: int) -> list[str]:
        with Monitor(rc) as monitor:
            ring(rc, lane, bits)
        runs = [[c.split(" ")[0].upper() for c in run] for run in _script_runs(monitor.seen)]
        assert len(runs) == 1, runs
        return runs[0]

    assert ring_commands(1 << 3) == ["LPUSH"]
    assert _bell_bits(rc, lane) == [1 << 3]
    assert ring_commands(1 << 5) == ["LPUSH", "RPOP", "LSET"]  # a token there: merged into one
    assert _bell_bits(rc, lane) == [1 << 3 | 1 << 5]
    assert ring_commands(1 << 3 | 1 << 5 | 1) == ["LPUSH", "RPOP"]  # this ring's bits hold the old token's
    assert _bell_bits(rc, lane) == [1 << 3 | 1 << 5 | 1]
    rc.delete(bell)
    rc.rpush(bell, "garbage")  # an unreadable token names every list, as a worker reads it
    ring_commands(1)
    assert _bell_bits(rc, lane) == [1023]
    rc.delete(bell)
