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
