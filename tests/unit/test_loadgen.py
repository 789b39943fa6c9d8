"""The one load generator's senders: open-loop schedules, retries of ``unavailable`` with the same key."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tools import loadgen
from tools.loadcheck import Sent


@dataclass
class Answer:
    accepted: bool
    reason: str = ""
    detail: str = ""
    task_id: str = ""
    duplicate: bool = False


class Admit:
    """Stands in for ``tasks.dispatch.admit``: answers ``unavailable`` to the first ``refuse`` calls of each key."""

    def __init__(self, refuse: int = 0, detail: str = "outcome unknown: timeout") -> None:
        self.refuse, self.detail = refuse, detail
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, type_name, payload, *, chat_id=None, idempotency_key=None, timeout=None) -> Answer:
        with self.lock:
            self.calls.append(idempotency_key)
            n = self.calls.count(idempotency_key)
        if n <= self.refuse:
            return Answer(False, "unavailable", self.detail)
        return Answer(True, task_id=f"t-{idempotency_key}", duplicate=n > 1)


def _run(schedules, admit, *, retry_for: float, rate: float = 1000.0, start: float | None = None) -> list[dict]:
    out: list[dict] = []
    loadgen.send(schedules, admit=admit, start=start or time.time(), rate=rate, record=out.append,
                 stop=threading.Event(), retry_for=retry_for, timeout=10)
    return out


def test_an_unavailable_answer_is_retried_with_the_same_key_unless_retry_for_is_zero():
    msg = loadgen.Message(0, "t", "c", 0, "r:c:0", {"seq": 0})
    admit = Admit(refuse=1)
    (careful,) = _run([loadgen.planned([msg])], admit, retry_for=5)
    assert admit.calls == ["r:c:0", "r:c:0"]
    assert (careful["accepted"], careful["calls"], careful["first"], careful["unknown_seen"]) == \
        (True, 2, "unavailable", True)
    (one_shot,) = _run([loadgen.planned([msg])], Admit(refuse=1), retry_for=0)
    assert (one_shot["accepted"], one_shot["calls"]) == (None, 1)  # may have been stored: unknown
    assert Sent.from_entry(one_shot).accepted is False  # the load test counts it as not accepted


def test_planned_messages_keep_their_due_times_and_per_sender_order():
    parts = [[loadgen.Message(i, "t", f"c{j}", seq, f"k{j}:{seq}", {"seq": seq})
              for seq, i in enumerate(range(j, 6, 2))] for j in range(2)]
    start = time.time()
    out = _run([loadgen.planned(p) for p in parts], Admit(), retry_for=0, rate=100.0, start=start)
    assert sorted(e["scheduled_ms"] for e in out) == [(start + i / 100.0) * 1000 for i in range(6)]
    assert all(e["started_ms"] >= e["scheduled_ms"] - 1 and e["done_ms"] >= e["started_ms"] for e in out)
    for j in range(2):
        assert [e["seq"] for e in out if e["chat"] == f"c{j}"] == [0, 1, 2]


def test_the_campaign_schedule_sends_each_chat_in_sequence_with_its_keys():
    spec = {"run": "r", "chats": 3, "rate": 200.0, "duration": 0.1, "threads": 2,
            "mix": [{"kind": "ok", "type": "t", "weight": 1, "payload": {"x": 1}}]}
    t0 = time.time()
    admit = Admit()
    out = _run(loadgen.ticket_schedules(spec, t0), admit, retry_for=0, rate=200.0, start=t0)
    assert len(out) == len(admit.calls) == 20  # every ticket due before the end, once
    for chat in ("r-c0", "r-c1", "r-c2"):
        mine = [e for e in out if e["chat"] == chat]
        assert [e["seq"] for e in mine] == list(range(len(mine))) and mine
        assert all(e["key"] == f"r:{chat}:{e['seq']}" for e in mine)


class DispatchMany:
    """Stands in for ``tasks.bulk.dispatch_many``: each call takes ``call_s``; keys in ``unknown`` answer
    ``unavailable`` (outcome unknown), ``full`` ones are rejected, the rest accepted."""

    def __init__(self, call_s: float = 0.0, unknown: frozenset = frozenset(), full: frozenset = frozenset()) -> None:
        self.call_s, self.unknown, self.full = call_s, unknown, full
        self.chunks: list[list[tuple[int, dict]]] = []
        self.lock = threading.Lock()

    def __call__(self, type_name, items, *, timeout=None) -> list[Answer]:
        with self.lock:
            self.chunks.append([(payload["seq"], options) for payload, options in items])
        time.sleep(self.call_s)
        out = []
        for _payload, options in items:
            key = options["idempotency_key"]
            if key in self.unknown:
                out.append(Answer(False, "unavailable", "outcome unknown: connection lost"))
            elif key in self.full:
                out.append(Answer(False, "lane_full", "lane is full"))
            else:
                out.append(Answer(True, task_id=f"t-{key}"))
        return out


def test_bulk_chunks_hold_what_is_due_when_they_go_and_keep_each_chats_order_and_answers():
    # One sender, 200 messages due over 0.2 s, each call taking 20 ms: a chunk holds what fell due meanwhile.
    msgs = [loadgen.Message(i, "t", f"c{i % 3}", i // 3, f"k{i}", {"seq": i // 3}, limit_key=f"lk{i % 2}")
            for i in range(200)]
    many = DispatchMany(call_s=0.02, unknown=frozenset({"k5"}), full=frozenset({"k7"}))
    out: list[dict] = []
    start = time.time()
    loadgen.send_bulk([loadgen.planned(msgs)], dispatch_many=many, bulk=50, start=start, rate=1000.0,
                      record=out.append, stop=threading.Event(), retry_for=0, timeout=10)
    assert [e["key"] for e in out] == [m.key for m in msgs]  # every message once, in schedule order
    assert sum(len(c) for c in many.chunks) == 200 and max(len(c) for c in many.chunks) <= 50
    assert len(many.chunks) < 200 / 5  # calls, not messages: 20 ms of calls let ~20 fall due
    assert all(opts["limit_key"] in ("lk0", "lk1") and opts["chat_id"] for c in many.chunks for _, opts in c)
    for chat in ("c0", "c1", "c2"):
        assert [e["seq"] for e in out if e["chat"] == chat] == list(range(len([m for m in msgs if m.chat == chat])))
    by_key = {e["key"]: e for e in out}
    assert by_key["k5"]["accepted"] is None and Sent.from_entry(by_key["k5"]).accepted is False  # unknown
    assert (by_key["k7"]["accepted"], by_key["k7"]["reason"]) == (False, "lane_full")
    assert by_key["k0"]["accepted"] is True and by_key["k0"]["chunk"] >= 1
    # Each item's latency runs from its own due time; a chunk goes once its first item is due.
    assert [e["scheduled_ms"] for e in out] == [(start + i / 1000.0) * 1000 for i in range(200)]
    assert all(e["started_ms"] >= e["scheduled_ms"] - 1 and e["done_ms"] >= e["started_ms"] for e in out)


def test_bulk_retries_unknown_items_with_their_keys_for_retry_for():
    msgs = [loadgen.Message(i, "t", f"c{i}", 0, f"k{i}", {"seq": 0}) for i in range(3)]

    class Flaky(DispatchMany):
        def __call__(self, type_name, items, *, timeout=None):
            self.unknown = frozenset({"k1"}) if not self.chunks else frozenset()
            return super().__call__(type_name, items, timeout=timeout)

    many = Flaky()
    out: list[dict] = []
    loadgen.send_bulk([loadgen.planned(msgs)], dispatch_many=many, bulk=10, start=time.time() - 1, rate=1000.0,
                      record=out.append, stop=threading.Event(), retry_for=5, timeout=10)
    assert [[opts["idempotency_key"] for _, opts in c] for c in many.chunks] == [["k0", "k1", "k2"], ["k1"]]
    k1 = next(e for e in out if e["key"] == "k1")
    assert (k1["accepted"], k1["calls"], k1["first"], k1["unknown_seen"]) == (True, 2, "unavailable", True)


def test_senders_keep_a_tenth_of_a_second_of_the_rate_in_flight():
    # A sender is blocked for its call (two Joiner turns): a fixed 4 senders capped the 1,000/s step at 913/s.
    assert loadgen.senders_for(100) == 10
    assert loadgen.senders_for(1000) == 100
    assert loadgen.senders_for(1200) == 120
    assert loadgen.senders_for(5) == loadgen.MIN_SENDERS
    assert loadgen.senders_for(1200, chats=50) == 50  # each sender owns its chats: never more than chats


def test_the_load_tests_default_senders_follow_the_rate():
    from tools.loadtest import LoadTestOptions
    from tools.smsload import SmsLoadOptions

    assert LoadTestOptions().senders == 0 and SmsLoadOptions().senders == 0  # 0: senders_for(rate) per step
