"""``dispatch_many`` (issue 16, bulk dispatch) against the real Redis and real workers.

Each item is judged on its own and answered in input order; a chunk of items
costs one round trip; an answer lost with Redis is "outcome unknown", and a
retry with the same keys creates nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
from django.test import override_settings

from lanes import keys
from tests.support.helpers import define, lane_depth, unique, wait_until


def _ran(sink) -> dict[str, int]:
    """Task id -> successful deliveries the sink saw."""
    counts: dict[str, int] = {}
    with sink.sink.lock:
        for attempt in sink.sink.attempts:
            if attempt.status == 200:
                task_id = attempt.headers.get("X-Dispatch-Task-Id", "")
                counts[task_id] = counts.get(task_id, 0) + 1
    return counts


def test_a_mixed_batch_answers_each_item_in_order_and_runs_the_accepted_once(rc, sink, start_worker):
    from tasks.dispatch import dispatch, dispatch_many

    name, lane = unique("bulk-mix"), unique("l-bulk-mix")
    define(name, handler="http.post", lane=lane, capacity=6, options={"url": sink.url})
    earlier = dispatch.delay(name, {"n": "pre"}, idempotency_key="k-pre")
    assert earlier.accepted
    items = [
        ({"n": 0}, {"idempotency_key": "k0"}),                      # 0 accepted (lane: 2)
        "not an object",                                            # 1 invalid_payload
        ({"n": 2}, {"colour": "red"}),                              # 2 unknown option
        ({"n": 3}, {"idempotency_key": "k3", "priority": 9}),       # 3 accepted (lane: 3)
        ({"n": 3}, {"idempotency_key": "k3", "priority": 9}),       # 4 duplicate of item 3
        ({"n": "pre"}, {"idempotency_key": "k-pre"}),               # 5 duplicate of the earlier dispatch
        ({"n": 6}, {"priority": 42}),                               # 6 invalid_priority
        ({"other": 7}, {"idempotency_key": "k3"}),                  # 7 same key, other payload
        ({"n": 8}, {"idempotency_key": "k8", "timeout": 30}),       # 8 accepted (lane: 4)
        [{"n": 9}, {"idempotency_key": "k9"}],                      # 9 a JSON-style pair: accepted (lane: 5)
        ({"n": 10}, {"idempotency_key": "k10"}),                    # 10 accepted (lane: 6, full)
        ({"n": 11}, {"idempotency_key": "k11"}),                    # 11 lane_full
        ({"n": 12}, {"timeout": -1}),                               # 12 invalid_timeout
        ({"n": 13}, {"idempotency_key": "k13"}),                    # 13 lane_full
    ]
    results = dispatch_many(name, items, timeout=60)

    assert len(results) == len(items)
    shape = [(r.accepted, r.reason, r.duplicate) for r in results]
    assert shape == [
        (True, None, False), (False, "invalid_payload", False), (False, "invalid_payload", False),
        (True, None, False), (True, None, True), (True, None, True), (False, "invalid_priority", False),
        (False, "idempotency_conflict", False), (True, None, False), (True, None, False), (True, None, False),
        (False, "lane_full", False), (False, "invalid_timeout", False), (False, "lane_full", False),
    ]
    assert "colour" in results[2].detail
    assert results[4].task_id == results[3].task_id
    assert results[5].task_id == earlier.task_id
    assert results[3].priority == 9 and results[0].priority == results[8].priority
    assert lane_depth(rc, lane) == 6  # nothing beyond the capacity was stored

    fresh = {results[i].task_id for i in (0, 3, 8, 9, 10)}
    expected = fresh | {earlier.task_id}
    start_worker(lane, pool="threads", concurrency=4)
    wait_until(lambda: set(_ran(sink)) >= expected, timeout=60, interval=0.2, what="the accepted tasks ran")
    wait_until(lambda: lane_depth(rc, lane) == 0, timeout=20, what="the lane drained")
    ran = _ran(sink)
    assert set(ran) == expected and all(n == 1 for n in ran.values()), ran


def _commands(rc) -> int:
    return sum(int(stat["calls"]) for stat in rc.info("commandstats").values())


def test_one_round_trip_and_one_script_call_per_chunk(rc, monkeypatch):
    """Counted at the socket (sends that carry EVALSHA) and by Redis (EVALSHAs and every command it ran)."""
    from redis.connection import AbstractConnection

    from tasks import bulk
    from tasks.dispatch import dispatch_many

    name, lane = unique("bulk-rt"), unique("l-bulk-rt")
    define(name, lane=lane)
    dispatch_many(name, [{"warm": True}])  # the script is loaded, the config cached
    monkeypatch.setattr(bulk, "CHUNK_ITEMS", 100)
    sends = _count_evalsha_sends(monkeypatch, AbstractConnection)
    before = int(rc.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    commands_before = _commands(rc)
    results = dispatch_many(name, [{"i": i} for i in range(250)])
    commands = _commands(rc) - commands_before - 2  # the two INFOs' own
    after = int(rc.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    assert all(r.accepted for r in results)
    chunks = bulk.chunk_sizes(250)
    assert chunks == [50, 100, 50, 50] and len(chunks) < 250
    assert sends == [1] * len(chunks)  # a round trip a chunk, one admit.lua call each
    assert after - before == len(chunks)
    assert lane_depth(rc, lane) == 251
    # Issue 16's budget: a plain item costs its record's HSET; the lane's shared writes (waiting count,
    # deadlines, leases, list) and the call itself are once a chunk. a chunk of one is 7 an item.
    assert commands <= 250 * 1.2, commands
    ready = [rc.lindex(q, -1) for q in keys.lane_queues(lane) if rc.llen(q)]
    assert ready and sum(rc.llen(q) for q in keys.lane_queues(lane)) == 251
    # No queued lease while a copy waits in its list: the pop that takes it writes one (pop_more.lua).
    waiting = [keys.task_record(r.task_id) for r in results]
    assert rc.zmscore(keys.LEASES, waiting) == [None] * 250
    assert None not in rc.zmscore(keys.DEADLINES, waiting)


def _script_loads(rc) -> int:
    """SCRIPT calls Redis ran, LOAD and FLUSH (``cmdstat_script`` before Redis 7, ``cmdstat_script|load`` ...
    since)."""
    stats = rc.info("commandstats")
    return sum(int(stat["calls"]) for name, stat in stats.items()
               if name == "cmdstat_script" or name.startswith("cmdstat_script|"))


def test_a_server_that_has_the_script_gets_no_script_load_and_one_that_lost_it_gets_it_again(rc):
    """Admission sends ``SCRIPT LOAD`` only until this process saw the server load it; after a
    ``SCRIPT FLUSH`` the first call answers NOSCRIPT (nothing ran) and is sent again with it, once."""
    from tasks.dispatch import dispatch, dispatch_many

    name, lane = unique("bulk-load"), unique("l-bulk-load")
    define(name, lane=lane, timeout=3600)  # never due to expire while the session runs (expire_due's batch)
    dispatch_many(name, [{"warm": i} for i in range(3)])
    loads = _script_loads(rc)
    assert all(r.accepted for r in dispatch_many(name, [{"i": i} for i in range(60)]))  # two chunks
    assert dispatch.delay(name, {"one": 1}).accepted
    assert _script_loads(rc) == loads
    rc.script_flush()
    results = [*dispatch_many(name, [{"after": i} for i in range(60)]), dispatch.delay(name, {"after": "one"})]
    assert all(r.accepted for r in results), [r for r in results if not r.accepted][:3]
    assert rc.exists(*(keys.task_record(r.task_id) for r in results)) == len(results)
    assert lane_depth(rc, lane) == 3 + 60 + 1 + 61  # each item stored once
    assert _script_loads(rc) - loads == 2  # the flush, then one load


def test_a_chunk_admits_like_one_dispatch_a_call(rc):
    """The same items through dispatch_many (chunks of many) and through a loop of
    dispatch.delay (a chunk of one each), on two types configured alike: the same answers, records,
    lane lists (in the same order), leases, deadlines and waiting counts."""
    from tasks.dispatch import dispatch, dispatch_many

    def items(tag: str) -> list:
        out = []
        for i in range(14):
            # Four for chat c0 first (its queue holds 3), then the chats in turn.
            options = {"chat_id": f"{tag}-c{0 if i < 4 else i % 3}", "priority": (i * 7) % 10}
            if i in (5, 6):
                options["idempotency_key"] = f"{tag}-same"  # the second is a duplicate of the first
            if i == 7:
                options["idempotency_key"] = f"{tag}-other"
            out.append(({"i": 5 if i == 6 else i}, options))
        out.append(({"i": 99}, {"chat_id": f"{tag}-c0", "idempotency_key": f"{tag}-other"}))  # a conflict
        return out

    def state(type_name: str, lane: str, tag: str, results) -> dict:
        def record(r):
            found = rc.hgetall(keys.task_record(r.task_id, r.chat_id or None))
            kept = {k.decode(): v.decode() for k, v in found.items() if k not in (b"msg", b"dl")}
            return {k: v.replace(type_name, "T").replace(lane, "L").replace(tag, "X") for k, v in kept.items()}

        accepted = [r for r in results if r.accepted and not r.duplicate]
        names = {keys.task_record(r.task_id, r.chat_id or None): n for n, r in enumerate(results)}
        return {
            "answers": [(r.accepted, r.reason, r.position, r.duplicate,
                         next((n for n, o in enumerate(results) if o.task_id == r.task_id), None)) for r in results],
            "records": [record(r) for r in accepted],
            "lists": [[names.get(_record_of(m)) for m in rc.lrange(q, 0, -1)] for q in keys.lane_queues(lane)],
            "waiting": rc.get(keys.LANE_PREFIX + lane + ":waiting"),
            "leased": [rc.zscore(keys.LEASES, keys.task_record(r.task_id, r.chat_id or None)) is not None
                       for r in accepted],
            "deadlines": [rc.zscore(keys.DEADLINES, keys.task_record(r.task_id, r.chat_id or None)) is not None
                          for r in accepted],
        }

    states = []
    for how in ("many", "loop"):
        type_name, lane = unique(f"bulk-same-{how}"), unique(f"l-bulk-same-{how}")
        define(type_name, lane=lane, chat_scoped=True, chat_queue_size=3, capacity=8)
        tag = unique(how)
        if how == "many":
            results = dispatch_many(type_name, items(tag))
        else:
            results = [dispatch.delay(type_name, payload, **options) for payload, options in items(tag)]
        states.append(state(type_name, lane, tag, results))
    many, loop = states
    assert [a[1] for a in many["answers"]].count("lane_full") >= 1  # capacity 8 of 15
    assert [a[1] for a in many["answers"]].count("chat_queue_full") >= 1
    assert [a[1] for a in many["answers"]].count("idempotency_conflict") == 1
    assert [a[3] for a in many["answers"]].count(True) == 1
    assert many == loop


def _record_of(item: bytes) -> str:
    return item.decode().rpartition("#")[0]  # the list names the record (lanes.messages.LIST_ITEM_SEPARATOR)


@pytest.fixture
def fast_failing_redis():
    """The platform's client with a 1 s timeout (dispatch answers ``unavailable`` quickly)."""
    from lanes.redis_client import reset_redis

    with override_settings(DISPATCH_REDIS_TIMEOUT_S=1.0):
        reset_redis()
        yield
    reset_redis()


def test_an_unknown_outcome_then_a_retry_with_the_same_keys_creates_nothing_twice(
        rc, sink, start_worker, redis_server, monkeypatch, fast_failing_redis):
    """Redis is frozen (SIGSTOP, as the fault campaign does) just as the second chunk goes out."""
    from tasks import bulk
    from tasks.dispatch import dispatch_many

    name, lane = unique("bulk-unk"), unique("l-bulk-unk")
    define(name, handler="http.post", lane=lane, options={"url": sink.url})
    monkeypatch.setattr(bulk, "CHUNK_ITEMS", 5)
    monkeypatch.setattr(bulk, "IN_FLIGHT", 2)  # two chunks out when the second's answer is due: the fourth waits
    items = [({"n": i}, {"idempotency_key": f"unk-{i}"}) for i in range(17)]
    dispatch_many(name, [({"n": "warm"}, {"idempotency_key": "unk-warm"})])  # script loaded, config cached

    from lanes.lua.loader import ScriptStream

    real_send = ScriptStream.send
    calls = []

    def freeze_before_second_chunk(stream, script_calls):
        calls.append(_items_in(script_calls))
        if len(calls) == 2:  # the first chunk was sent: once Redis ran it, freeze Redis
            wait_until(lambda: lane_depth(rc, lane) == 6, timeout=10, what="the first chunk stored")
            os.kill(redis_server.proc.pid, signal.SIGSTOP)
            threading.Timer(2.5, os.kill, (redis_server.proc.pid, signal.SIGCONT)).start()
        return real_send(stream, script_calls)

    monkeypatch.setattr(ScriptStream, "send", freeze_before_second_chunk)
    try:
        first = dispatch_many(name, items)
    finally:
        wait_until(lambda: _answers(rc), timeout=10, what="Redis answers again")
    monkeypatch.setattr(ScriptStream, "send", real_send)

    assert calls == [5, 5, 5, 2]
    assert [r.accepted for r in first[:5]] == [True] * 5
    assert [r.reason for r in first[5:10]] == ["unavailable"] * 5
    assert all("outcome unknown" in r.detail for r in first[5:10]), first[5].detail
    # The third chunk went out before the second's answer was due: its outcome is unknown too; the
    # fourth was not sent (the connection had failed): nothing of it was written.
    assert all(r.reason == "unavailable" and "outcome unknown" in r.detail for r in first[10:15])
    assert all(r.reason == "unavailable" and "nothing was written" in r.detail for r in first[15:])

    again = dispatch_many(name, items)
    assert all(r.accepted for r in again), [r.detail for r in again if not r.accepted]
    assert [r.task_id for r in again[:5]] == [r.task_id for r in first[:5]]
    assert all(r.duplicate for r in again[:5])
    assert not any(r.duplicate for r in again[15:])  # nothing was written: made now
    third = dispatch_many(name, items)
    assert [r.task_id for r in third] == [r.task_id for r in again] and all(r.duplicate for r in third)

    ids = {r.task_id for r in again}
    assert len(ids) == 17
    start_worker(lane, pool="threads", concurrency=4)
    wait_until(lambda: set(_ran(sink)) >= ids, timeout=60, interval=0.2, what="every item ran")
    wait_until(lambda: lane_depth(rc, lane) == 0, timeout=20, what="the lane drained")
    ran = _ran(sink)
    assert all(ran[task_id] == 1 for task_id in ids), ran
    assert len(ran) == 18  # the seventeen and the warm-up: nothing was created twice
    assert all(n == 1 for key, n in sink.sink.applied.items() if key.startswith("unk-"))


def _answers(client) -> bool:
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - still frozen
        return False


def test_the_api_bulk_endpoint_sends_its_items_in_one_round_trip(monkeypatch):
    from redis.connection import AbstractConnection

    from tests.support.api_client import ApiClient, make_token

    name = unique("bulk-api")
    define(name, lane=unique("l-bulk-api"))
    client = ApiClient(make_token(unique("svc"), [name]))
    from lanes.lua.loader import ScriptStream

    real_send = ScriptStream.send
    chunks: list[int] = []

    def counting(stream, calls):
        chunks.append(_items_in(calls))
        return real_send(stream, calls)

    monkeypatch.setattr(ScriptStream, "send", counting)
    sends = _count_evalsha_sends(monkeypatch, AbstractConnection)
    r = client.post("/dispatch/bulk", {"task_type": name, "items": [{"n": i} for i in range(20)] + ["bad"]})
    assert r.status_code == 200, r.content
    assert [x["accepted"] for x in r.json()["results"]] == [True] * 20 + [False]
    # One admit.lua call for every valid item, in one send, not one send (or call) each.
    assert chunks == [20] and max(sends) == 1


def _items_in(call) -> int:
    """The items of the one admit.lua call a chunk sends (its shared arguments, then a fixed count an item)."""
    from lanes.lua import admit

    return (call.count - call.numkeys - admit.SHARED_ARGS) // admit.ITEM_ARGS


def _count_evalsha_sends(monkeypatch, connection_class) -> list[int]:
    """Record, per send on a Redis connection, how many EVALSHA commands it carried."""
    sends: list[int] = []
    real_send = connection_class.send_packed_command

    def counting_send(self, command, check_health=True):
        chunks = [command] if isinstance(command, (bytes, str)) else command
        evalshas = sum(bytes(c).count(b"\r\nEVALSHA\r\n") for c in chunks if isinstance(c, (bytes, memoryview)))
        if evalshas:
            sends.append(evalshas)
        return real_send(self, command, check_health)

    monkeypatch.setattr(connection_class, "send_packed_command", counting_send)
    return sends


# --- manage.py dispatch TYPE --payloads-file FILE.jsonl --------------------------------------

def _manage(*args: str, env: dict | None = None):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "manage.py", *args], cwd=root, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=120)


def test_cli_payloads_file_judges_each_line_and_exits_by_the_worst(rc, tmp_path, monkeypatch):
    import io

    from django.core.management import CommandError, call_command

    from tasks import bulk

    name, lane = unique("bulk-cli"), unique("l-bulk-cli")
    define(name, lane=lane)
    lines = [
        '{"n": 1}',                                                        # 1 accepted
        '{"payload": {"n": 2}, "options": {"idempotency_key": "cli-2"}}',  # 2 accepted (wrapper)
        '{"n": 3',                                                         # 3 not JSON
        "",                                                                # 4 blank: skipped
        '{"payload": {"n": 5}, "options": {"priority": 11}}',              # 5 invalid_priority
        '[1, 2, 3]',                                                       # 6 a list is no payload
        '{"payload": {"n": 2}, "options": {"idempotency_key": "cli-2"}}',  # 7 duplicate of line 2
        '{"payload": {"n": 8}, "options": {"colour": "red"}}',             # 8 unknown option
    ]
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(lines) + "\n")
    results_path = tmp_path / "results.jsonl"
    done = _manage("dispatch", name, "--payloads-file", str(path), "--results", str(results_path), "--priority", "7")
    assert done.returncode == 1, (done.stdout, done.stderr)
    summary = json.loads(done.stdout)
    assert (summary["lines"], summary["accepted"], summary["duplicates"], summary["unavailable"]) == (7, 3, 1, 0)
    assert summary["rejected"] == {"invalid_payload": 3, "invalid_priority": 1}
    listed = {(x["line"], x["reason"]) for x in summary["rejections"]}
    assert listed == {(3, "invalid_payload"), (5, "invalid_priority"), (6, "invalid_payload"), (8, "invalid_payload")}
    assert "line 3 is not valid JSON" in next(x["detail"] for x in summary["rejections"] if x["line"] == 3)
    written = [json.loads(line) for line in results_path.read_text().splitlines()]
    assert [x["line"] for x in written] == [1, 2, 3, 5, 6, 7, 8]
    assert written[0]["priority"] == 7 and written[5]["task_id"] == written[1]["task_id"]
    assert written[0]["task_id"].startswith("cli-")  # the task remembers it came from the CLI (tasks.owners)
    assert lane_depth(rc, lane) == 2

    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(5)))
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(bulk, "CHUNK_ITEMS", 2)  # a "long" file: a progress line per chunk
    call_command("dispatch", name, "--payloads-file", str(good), stdout=out, stderr=err)  # no SystemExit: 0
    assert json.loads(out.getvalue())["accepted"] == 5
    assert err.getvalue().splitlines() == [f"{n} lines: {n} accepted, 0 rejected, 0 unavailable" for n in (2, 4, 5)]
    with pytest.raises(CommandError, match="--idempotency-key does not go with --payloads-file") as refused:
        call_command("dispatch", name, "--payloads-file", str(good), "--idempotency-key", "k")
    assert refused.value.returncode == 2
    with pytest.raises(CommandError, match=r"missing\.jsonl") as refused:
        call_command("dispatch", name, "--payloads-file", str(tmp_path / "missing.jsonl"))
    assert refused.value.returncode == 2

    done = _manage("dispatch", name, "--payloads-file", str(good), env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode == 5, (done.stdout, done.stderr)
    assert json.loads(done.stdout)["unavailable"] == 5


def test_a_config_change_mid_call_requeues_the_rest_in_order(rc, monkeypatch):
    """admit.lua answers 'stale' from the second chunk on: those items are judged again, in order."""
    from lanes.config_version import bump_config_version
    from lanes.lua.loader import ScriptStream
    from tasks import bulk
    from tasks.dispatch import dispatch_many

    name, lane = unique("bulk-stale"), unique("l-bulk-stale")
    define(name, lane=lane, chat_scoped=True, chat_queue_size=100)
    dispatch_many(name, [({"warm": 1}, {"chat_id": "warm"})])
    monkeypatch.setattr(bulk, "CHUNK_ITEMS", 4)
    real_send = ScriptStream.send
    sent: list[int] = []

    def bump_after_the_first_chunk(stream, calls):
        sent.append(_items_in(calls))
        if len(sent) == 2:
            bump_config_version()
        return real_send(stream, calls)

    monkeypatch.setattr(ScriptStream, "send", bump_after_the_first_chunk)
    results = dispatch_many(name, [({"seq": i}, {"chat_id": "stale-chat"}) for i in range(10)])
    assert all(r.accepted for r in results), [r.detail for r in results if not r.accepted]
    assert [r.position for r in results] == list(range(1, 11))  # the chat's order is the input's
    assert sent[:2] == [4, 4] and sum(sent) > 10  # the stale items went again


def test_too_few_replica_acks_make_every_accepted_item_unknown(rc):
    from django.test import override_settings

    from tasks.dispatch import dispatch_many

    name = unique("bulk-acks")
    define(name, lane=unique("l-bulk-acks"))
    with override_settings(DISPATCH_REPLICA_ACKS=1, DISPATCH_REPLICA_ACKS_TIMEOUT_MS=50):
        results = dispatch_many(name, [{"n": 1}, "bad", {"n": 2}])
    assert [r.reason for r in results] == ["unavailable", "invalid_payload", "unavailable"]
    assert "0 of 1 replicas confirmed" in results[0].detail and "outcome unknown" in results[0].detail


def test_bulkbench_prints_both_modes_and_their_round_trips():
    """The benchmark's figure stays printable (a count, never a time, is asserted)."""

    done = _manage("bulkbench", "--items", "120", "--rounds", "1", "--warmup", "10", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {row["mode"]: row for row in json.loads(done.stdout)["rows"]}
    assert set(rows) == {"loop", "dispatch_many"}
    assert rows["loop"]["redis_round_trips_per_item"] >= 1
    assert rows["dispatch_many"]["redis_round_trips_per_item"] < 0.1  # 120 items: one chunk
    assert rows["loop"]["rejected"] == rows["dispatch_many"]["rejected"] == 0


def test_a_config_change_seen_by_validation_keeps_the_chunks_in_flight_ahead(rc, monkeypatch):
    """Chunk 1 goes out under a config that just changed; chunk 2's invalid item makes validation see the
    change: chunk 1 comes back stale and must still be admitted before chunk 2 (a chat's order)."""
    from lanes.config_version import bump_config_version
    from lanes.lua.loader import ScriptStream
    from tasks import bulk
    from tasks.dispatch import dispatch_many

    name, lane = unique("bulk-stale2"), unique("l-bulk-stale2")
    define(name, lane=lane, chat_scoped=True, chat_queue_size=100)
    dispatch_many(name, [({"warm": 1}, {"chat_id": "warm"})])
    monkeypatch.setattr(bulk, "CHUNK_ITEMS", 4)
    real_send = ScriptStream.send
    sent: list[int] = []

    def bump_before_the_first_chunk(stream, calls):
        sent.append(_items_in(calls))
        if len(sent) == 1:
            bump_config_version()
        return real_send(stream, calls)

    monkeypatch.setattr(ScriptStream, "send", bump_before_the_first_chunk)
    items = [({"seq": i}, {"chat_id": "stale-chat-2"}) for i in range(8)]
    items[5] = ({"seq": 5}, {"chat_id": "stale-chat-2", "priority": 99})  # invalid: validation confirms the config
    results = dispatch_many(name, items)
    assert [r.reason for r in results] == [None] * 5 + ["invalid_priority"] + [None] * 2
    assert [r.position for r in results if r.accepted] == list(range(1, 8))  # the chat's order is the input's


def test_dispatch_many_by_name_answers_a_dict_per_item(rc):
    """``tasks.dispatch_many`` as an ingress worker runs it for a caller sending it by name (pairs as JSON lists)."""
    from tasks.bulk import dispatch_many_by_name

    name = unique("bulk-name")
    define(name, lane=unique("l-bulk-name"))
    answers = dispatch_many_by_name(name, [{"n": 1}, [{"n": 2}, {"priority": 3}], [{"n": 3}, {"nope": 1}]],
                                    timeout=30)
    assert [(a["accepted"], a["reason"]) for a in answers] == [(True, None), (True, None), (False, "invalid_payload")]
    assert answers[1]["priority"] == 3
    (only,) = dispatch_many_by_name(name, {"n": 1})
    assert only["reason"] == "invalid_payload" and "items must be a list" in only["detail"]
    refused = dispatch_many_by_name(name, [{"n": 1}, {"n": 2}], chat_id="c")
    assert [a["reason"] for a in refused] == ["invalid_payload"] * 2 and "chat_id" in refused[0]["detail"]


def test_the_lane_depth_holds_across_an_item_that_takes_admit_luas_own_path(rc):
    """An item sent for later flushes the chunk's deferred writes and is counted by admit.lua's own
    INCR; the items after it must see that depth, not the one read before it (capacity 3 of 4)."""
    from tasks.dispatch import dispatch_many

    name, lane = unique("bulk-depth"), unique("l-bulk-depth")
    define(name, lane=lane, capacity=3)
    results = dispatch_many(name, [{"n": 0}, {"n": 1}, ({"n": 2}, {"countdown": 30}), {"n": 3}])
    assert [r.accepted for r in results] == [True, True, True, False], [r.reason for r in results]
    assert results[3].reason == "lane_full"
    assert rc.get(keys.LANE_PREFIX + lane + ":waiting") == b"3"
