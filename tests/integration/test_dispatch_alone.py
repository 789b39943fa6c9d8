"""A lone ``dispatch.delay`` (a chunk of one through ``tasks.bulk.Admission`` and ``lanes.lua.admit.Calls``): what
it costs Redis, counted with MONITOR (never timed), and that the connection admission keeps between calls
(``lanes.lua.loader._take_connection``) is checked as the pool checks one, so a connection the server closed or a
script it lost costs the next call nothing."""

from __future__ import annotations

import os
import time

import pytest

from lanes import keys
from lanes.lua import loader
from lanes.lua.admit import Calls
from tasks import bulk
from tasks.dispatch import dispatch, dispatch_many
from tests.integration.test_doorbells import Monitor, _script_runs
from tests.support.helpers import define, unique

pytestmark = pytest.mark.django_db(transaction=True)

CALLS = 20
#: Inside admit.lua, a plain dispatch onto a list that holds messages (test_doorbells pins the same); no queued
#: lease's ZADD since 2026-12-02 (the pop that takes the message writes it, pop_more.lua).
PLAIN = ["GET", "INCR", "HSET", "ZADD", "LPUSH"]


def _runs_and_client_commands(monitor: Monitor, lane: str) -> tuple[list[list[str]], list[str]]:
    """Each admit.lua run onto ``lane``'s lists (commands by name), and every command sent on the connections
    that sent an EVALSHA (the other clients' are the test's own, the counters' flush, handshakes)."""
    lists = set(keys.lane_queues(lane))
    runs = [[c.split(" ")[0].upper() for c in run] for run in _script_runs(monitor.seen)
            if any(c.split(" ")[0].upper() == "LPUSH" and set(c.split(" ")[1:2]) & lists for c in run)]
    clients = [c for c in monitor.seen if c["client_type"] != "lua"]
    callers = {(c["client_address"], c["client_port"]) for c in clients if c["command"].startswith("EVALSHA ")}
    sent = [c["command"].split(" ")[0].upper() for c in clients if (c["client_address"], c["client_port"]) in callers]
    return runs, sent


def test_a_dispatch_to_a_lane_nobody_serves_reads_two_estimate_inputs_not_four(rc):
    """A lane without a live consumer has its estimate inputs read at every call (a worker that starts shows
    at once); only its paused flag and consumers are read, which are all its estimate says
    ("no worker consumes..."): 7 commands in the script and the EVALSHA (8 with the queued lease's ZADD), 10
    before (two HMGETs)."""
    lane, type_name = unique("alone-nc"), unique("alone-nc-echo")
    define(type_name, lane=lane)
    assert dispatch.delay(type_name, {"first": True}).accepted  # the list holds messages: no ring below
    with Monitor(rc) as monitor:
        results = [dispatch.delay(type_name, {"i": i}) for i in range(CALLS)]
    assert all(r.accepted and "no worker consumes lane" in r.detail for r in results), results[0]
    runs, sent = _runs_and_client_commands(monitor, lane)
    assert len(runs) == CALLS, runs
    for run in runs:
        assert run == [*PLAIN, "SISMEMBER", "ZCOUNT"], run
    assert sent == ["EVALSHA"] * CALLS, sent  # one round trip a dispatch, nothing else on its connection
    rc.delete(*keys.lane_queues(lane), keys.lane_doorbell(lane))


def test_a_served_lane_reads_its_estimate_inputs_at_most_once_a_second(rc):
    """With a live consumer the reading is reused (``ESTIMATE_INPUTS_TTL_S``): every dispatch after the first
    runs the five commands and nothing else, one round trip each."""
    lane, type_name = unique("alone-ok"), unique("alone-ok-echo")
    define(type_name, lane=lane)
    rc.zadd(keys.lane_consumers(lane), {"w@test": int(time.time() * 1000) + 60_000})
    assert dispatch.delay(type_name, {"first": True}).accepted  # reads (and keeps) the lane's inputs
    with Monitor(rc) as monitor:
        results = [dispatch.delay(type_name, {"i": i}) for i in range(CALLS)]
    assert all(r.accepted and "no worker consumes" not in r.detail for r in results), results[0]
    runs, sent = _runs_and_client_commands(monitor, lane)
    assert len(runs) == CALLS
    reading = {"HMGET", "SISMEMBER", "ZCOUNT"}
    assert sum(1 for run in runs if reading & set(run)) <= 2, runs  # a second boundary may fall in the loop
    for run in runs:
        assert [name for name in run if name not in reading] == PLAIN, run
    assert sent == ["EVALSHA"] * CALLS, sent
    rc.delete(*keys.lane_queues(lane), keys.lane_doorbell(lane), keys.lane_consumers(lane))


def test_a_kept_connection_the_server_closed_is_replaced_before_the_call(rc):
    """The connection a lone call keeps is checked before it sends (as the pool checks one it hands out): a
    connection the server closed since (its idle timeout, a restart) costs the next call nothing; were it
    met by the call, the call would answer 'unavailable, outcome unknown'."""
    lane, type_name = unique("alone-kill"), unique("alone-kill-echo")
    define(type_name, lane=lane)
    assert dispatch.delay(type_name, {"warm": True}).accepted
    assert loader._kept, "a lone call keeps its connection"
    kept = loader._kept[0][1]
    name = f"kept-{unique('c')}"
    kept.send_command("CLIENT", "SETNAME", name)
    assert kept.read_response() == b"OK"
    victims = [c for c in rc.client_list() if c.get("name") == name]
    assert len(victims) == 1
    rc.client_kill_filter(_id=victims[0]["id"])
    result = dispatch.delay(type_name, {"after": "kill"})
    assert result.accepted, result
    assert not any(c.get("name") == name for c in rc.client_list())


def test_a_lone_call_loads_admit_lua_again_after_redis_lost_it(rc):
    lane, type_name = unique("alone-flush"), unique("alone-flush-echo")
    define(type_name, lane=lane)
    assert dispatch.delay(type_name, {"warm": True}).accepted
    rc.script_flush()
    with Monitor(rc) as monitor:
        result = dispatch.delay(type_name, {"after": "flush"})
    assert result.accepted, result
    sent = [c["command"].split(" ")[0].upper() for c in monitor.seen if c["client_type"] != "lua"]
    # NOSCRIPT (nothing of it ran), then the script loaded and the call again, in one round trip: ran once.
    assert sent[:3] == ["EVALSHA", "SCRIPT", "EVALSHA"], sent
    assert rc.llen(keys.lane_queues(lane)[0]) + sum(rc.llen(q) for q in keys.lane_queues(lane)[1:]) == 2
    rc.delete(*keys.lane_queues(lane), keys.lane_doorbell(lane))


def test_a_forked_child_dispatches_on_its_own_connection_and_the_parents_stays_in_step(rc):
    """A process forked after a lone call (a prefork pool's child, a handler that dispatches) must not send on
    the connection its parent keeps: both would read each other's replies."""
    lane, type_name = unique("alone-fork"), unique("alone-fork-echo")
    define(type_name, lane=lane)
    assert dispatch.delay(type_name, {"parent": 0}).accepted
    parents = loader._kept[0][1]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answers through the pipe, then leaves without any cleanup
        try:
            result = dispatch.delay(type_name, {"child": 1})
            own = bool(loader._kept) and loader._kept[0][1] is not parents
            os.write(write_end, b"1" if result.accepted and own else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    assert os.read(read_end, 1) == b"1" and status == 0
    os.close(read_end)
    after = [dispatch.delay(type_name, {"parent": i}) for i in range(1, 4)]
    assert all(r.accepted for r in after), after
    assert loader._kept[0][1] is parents
    assert sum(rc.llen(q) for q in keys.lane_queues(lane)) == 5
    rc.delete(*keys.lane_queues(lane), keys.lane_doorbell(lane))


def test_a_lone_dispatch_and_a_chunk_take_the_one_path(rc, monkeypatch):
    """``dispatch.delay`` alone, ``dispatch_many`` of one and of three, and a dead letter's requeue: each one
    ``Admission.run`` and one ``Calls.send`` of its items, the same code (no walk of the steps of its own)."""
    lane, type_name = unique("alone-one"), unique("alone-one-echo")
    define(type_name, lane=lane)
    assert dispatch.delay(type_name, {"warm": True}).accepted
    runs: list[int] = []
    sends: list[int] = []
    real_run, real_send = bulk.Admission.run, Calls.send

    def run(self, queue):
        runs.append(len(queue))
        return real_run(self, queue)

    def send(self, chunk, items):
        sends.append(len(items))
        return real_send(self, chunk, items)

    monkeypatch.setattr(bulk.Admission, "run", run)
    monkeypatch.setattr(Calls, "send", send)
    assert dispatch.delay(type_name, {"alone": 1}).accepted
    assert dispatch.delay(type_name, {"alone": 2}, _replace_idempotency=True, _task_id=unique("requeued")).accepted
    assert [r.accepted for r in dispatch_many(type_name, [{"many": 1}])] == [True]
    assert [r.accepted for r in dispatch_many(type_name, [{"many": n} for n in range(3)])] == [True] * 3
    assert runs == [1, 1, 1, 3] and sends == [1, 1, 1, 3], (runs, sends)
    rc.delete(*keys.lane_queues(lane), keys.lane_doorbell(lane))
