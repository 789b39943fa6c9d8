"""The campaign's load generator: constant-rate chat-scoped dispatches, every answer recorded.

Run as a subprocess pointed at a scenario's own Redis through the environment
(``REDIS_URL``), so the test process's settings never change::

    python -m tests.faults.loadgen SPEC.json HISTORY.jsonl

SPEC: ``run`` (prefix of chats and keys), ``chats``, ``rate`` (dispatches per
second, all threads together), ``duration`` (s), ``threads``, ``retry_for``
(s a message keeps being retried with its key while dispatch answers
``unavailable``), ``mix`` (list of ``{"kind", "type", "weight", "payload"}``).

Each chat's messages are dispatched in sequence by one thread, each with the
idempotency key ``run:chat:seq``; an ``unavailable`` answer is retried with the
same key (what a careful caller does), so a dispatch whose outcome was unknown
resolves to the stored task (``duplicate=True``) or to a fresh one, never two.
One JSON line per message: its final answer, the number of calls, the slowest
call, and whether any answer said the outcome was unknown. Also ``burst`` mode:
``calls`` (list of ``{"type","payload","key","chat"}``), one thread each, all
released together once the file ``go_file`` appears (``ready_file`` is created
when this process is ready).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def _setup() -> None:
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchsite.settings")
    import django

    django.setup()


class History:
    def __init__(self, path: Path) -> None:
        self.fh = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def write(self, entry: dict) -> None:
        line = json.dumps(entry, separators=(",", ":"))
        with self.lock:
            self.fh.write(line + "\n")


def _call(admit, type_name: str, payload: dict, chat: str, key: str) -> tuple[object, float]:
    started = time.monotonic()
    result = admit(type_name, payload, chat_id=chat, idempotency_key=key, timeout=300)
    return result, time.monotonic() - started


def dispatch_one(admit, kind: dict, chat: str, seq: int, run: str, retry_for: float) -> dict:
    key = f"{run}:{chat}:{seq}"
    payload = {**kind.get("payload", {}), "run": run, "chat": chat, "seq": seq}
    first = time.time()
    calls, slowest, unknown, last, first_reason = 0, 0.0, False, None, None
    while True:
        result, took = _call(admit, kind["type"], payload, chat, key)
        calls += 1
        slowest = max(slowest, took)
        last = result
        if first_reason is None:
            first_reason = "accepted" if result.accepted else result.reason
        if result.reason != "unavailable":
            break
        unknown = unknown or result.detail.startswith("outcome unknown")
        if time.time() - first > retry_for:
            break
        time.sleep(0.2)
    accepted: bool | None = bool(last.accepted)
    if last.reason == "unavailable" and unknown:
        accepted = None  # gave up while an earlier call may have stored it
    return {
        "chat": chat, "seq": seq, "key": key, "kind": kind.get("kind", "ok"), "type": kind["type"],
        "accepted": accepted, "task_id": last.task_id or "", "reason": last.reason or "",
        "duplicate": bool(last.duplicate), "calls": calls, "slowest_s": round(slowest, 3),
        "unknown_seen": unknown, "t": round(first, 3), "done": round(time.time(), 3),
        "last_s": round(took, 4), "first": first_reason,
        "detail": (last.detail or "")[:200] if not last.accepted else "",
    }


def constant_rate(spec: dict, history: History, stop: threading.Event) -> None:
    from tasks.dispatch import admit

    run, n_chats, rate = spec["run"], int(spec["chats"]), float(spec["rate"])
    duration, n_threads = float(spec["duration"]), int(spec.get("threads", 8))
    retry_for = float(spec.get("retry_for", 60))
    mix = spec["mix"]
    plan = [k for k in mix for _ in range(int(k.get("weight", 1)))]
    chats = [f"{run}-c{i}" for i in range(n_chats)]
    ticket_lock = threading.Lock()
    counter = {"n": 0}
    t0 = time.time()
    end = t0 + duration

    def worker(index: int) -> None:
        mine = chats[index::n_threads]
        seqs = dict.fromkeys(mine, 0)
        turn = 0
        while not stop.is_set() and mine:
            with ticket_lock:
                n = counter["n"]
                counter["n"] += 1
            due = t0 + n / rate
            if due >= end:
                return
            delay = due - time.time()
            if delay > 0 and stop.wait(delay):
                return
            chat = mine[turn % len(mine)]
            turn += 1
            seq = seqs[chat]
            seqs[chat] += 1
            kind = plan[n % len(plan)]
            history.write(dispatch_one(admit, kind, chat, seq, run, retry_for))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def burst(spec: dict, history: History) -> None:
    from tasks.dispatch import admit

    calls = spec["calls"]
    # Warm up this process's configuration, then say ready and wait for the start signal
    # (a file), so every process's calls leave together.
    from tasks import config

    config.current()
    barrier = threading.Barrier(len(calls) + 1)

    def one(i: int, call: dict) -> None:
        barrier.wait()
        started = time.time()
        result = admit(call["type"], call["payload"], chat_id=call.get("chat"), idempotency_key=call["key"])
        history.write({"i": i, "key": call["key"], "accepted": result.accepted, "task_id": result.task_id or "",
                       "duplicate": result.duplicate, "reason": result.reason or "", "t": started,
                       "payload": call["payload"]})

    threads = [threading.Thread(target=one, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    Path(spec["ready_file"]).touch()
    go = Path(spec["go_file"])
    deadline = time.time() + 120
    while not go.exists() and time.time() < deadline:
        time.sleep(0.002)
    barrier.wait()
    for t in threads:
        t.join()


def main() -> int:
    spec_path, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    spec = json.loads(spec_path.read_text())
    _setup()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    history = History(out_path)
    if spec.get("mode") == "burst":
        burst(spec, history)
    else:
        constant_rate(spec, history, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
