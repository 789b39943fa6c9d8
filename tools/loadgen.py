"""The one load generator of the load test and the fault campaign: scheduled dispatches, every answer recorded.

Open loop: message ``index`` is due at ``start + index / rate`` whatever
happened to earlier ones, so a slow platform shows as latency (measured from
the due time) instead of being hidden by a generator that waits for it. Each
sender thread sends its own chats' messages in order, each with its own
idempotency key; an ``unavailable`` answer is retried with the same key for
``retry_for`` seconds (what a careful caller does), so a dispatch whose outcome
was unknown resolves to the stored task (``duplicate=True``) or to a fresh one,
never two. One record per message (:func:`dispatch_one`): its final answer, the
number of calls, the slowest call, whether any answer said the outcome was
unknown, and when it was due, began and ended.

:func:`send_bulk` sends the same schedules with ``dispatch_many`` instead
(``manage.py loadtest --bulk N``): each sender's chunk holds the messages due
by the time it is sent (up to N; one when the sender keeps up, more when it is
behind), each message keeps its due time, and each item's answer is recorded
as :func:`dispatch_one` records a message's.

Two schedules feed the same senders: the load test's (``manage.py loadtest``,
in process, ``tools/loadtest.py``: messages of random chats of the
``loadtest.sink`` type, planned ahead) and the fault campaign's
(:func:`constant_rate`: each thread's chats in turn, a shared ticket counter).
The fault campaign runs it as a subprocess pointed at a scenario's own Redis
through the environment (``REDIS_URL``), so the test process's settings never
change::

    python -m tools.loadgen SPEC.json HISTORY.jsonl

SPEC: ``run`` (prefix of chats and keys), ``chats``, ``rate`` (dispatches per
second, all threads together), ``duration`` (s), ``threads``, ``retry_for``
(s), ``mix`` (list of ``{"kind", "type", "weight", "payload"}``); keys are
``run:chat:seq``. Or ``"mode": "burst"``: ``calls`` (list of
``{"type","payload","key","chat"}``), one thread each, all released together
once the file ``go_file`` appears (``ready_file`` is created when this process
is ready).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Seconds between two calls of one message while dispatch answers ``unavailable``.
RETRY_PAUSE_S = 0.2
#: The fault campaign's whole-life timeout per task (s).
CAMPAIGN_TIMEOUT_S = 300
#: Seconds of a step's offered load the automatic sender count keeps in flight (:func:`senders_for`).
IN_FLIGHT_S = 0.1
#: The fewest sender threads :func:`senders_for` picks.
MIN_SENDERS = 4

Admit = Callable[..., Any]  # tasks.dispatch.admit
DispatchMany = Callable[..., list]  # tasks.bulk.dispatch_many


@dataclass(frozen=True)
class Message:
    """One message of a schedule."""

    index: int  # due at ``start + index / rate``
    type: str
    chat: str
    seq: int
    key: str
    payload: dict = field(default_factory=dict)
    kind: str = "ok"  # which part of the mix sent it
    limit_key: str | None = None  # for types with a key-scoped limit

    def options(self, timeout: float) -> dict[str, Any]:
        """Its dispatch options (``admit``'s and ``dispatch_many``'s keyword arguments)."""
        options: dict[str, Any] = {"chat_id": self.chat, "idempotency_key": self.key, "timeout": timeout}
        if self.limit_key is not None:
            options["limit_key"] = self.limit_key
        return options


def senders_for(rate: float, chats: int | None = None) -> int:
    """Sender threads for ``rate`` dispatches/s: enough to keep ``IN_FLIGHT_S`` of them in flight.

    A sender is blocked for its whole call, and concurrent calls of one process
    share one round trip at a time (``tasks.bulk.Joiner``): a message due while
    the turn in Redis runs waits for it and then for its own turn, two Redis
    turns in all (several ms each with ``appendfsync always``, tens on a loaded
    disk). With a fixed 4 senders, at most 4 messages rode a turn, so the
    generator, not the platform, capped a step at 4 per two turns (913/s offered
    at the 1,000/s step). One sender per ``rate * IN_FLIGHT_S`` lets a turn carry
    what fell due during it; never more senders than ``chats`` (each owns its
    chats' messages, in order).
    """
    n = max(MIN_SENDERS, int(rate * IN_FLIGHT_S + 0.999))
    return max(1, min(n, chats)) if chats else n


#: One per sender thread: the thread's next message, or None when it is done.
Schedule = Callable[[], "Message | None"]


def dispatch_one(admit: Admit, msg: Message, *, due: float, retry_for: float, timeout: float) -> dict:
    """Dispatch ``msg``, retrying ``unavailable`` with the same key for ``retry_for`` s; its history entry."""
    first = time.time()
    tries = _Tries()
    while True:
        started = time.monotonic()
        result = admit(msg.type, msg.payload, **msg.options(timeout))
        tries.answered(result, time.monotonic() - started)
        if result.reason != "unavailable":
            break
        if retry_for <= 0 or time.time() - first > retry_for:
            break
        time.sleep(RETRY_PAUSE_S)
    return _entry(msg, tries, due=due, first=first, ended=time.time())


@dataclass
class _Tries:
    """What the calls for one message came to."""

    calls: int = 0
    slowest: float = 0.0
    unknown: bool = False
    last: Any = None
    first_reason: str | None = None
    took: float = 0.0

    def answered(self, result: Any, took: float) -> None:
        self.calls += 1
        self.slowest = max(self.slowest, took)
        self.took = took
        self.last = result
        if self.first_reason is None:
            self.first_reason = "accepted" if result.accepted else result.reason
        if result.reason == "unavailable":
            self.unknown = self.unknown or (result.detail or "").startswith("outcome unknown")


def _entry(msg: Message, tries: _Tries, *, due: float, first: float, ended: float, chunk: int = 0) -> dict:
    """The history entry of ``msg`` (the fault campaign's and the load test's shape)."""
    last = tries.last
    accepted: bool | None = bool(last.accepted)
    if last.reason == "unavailable" and tries.unknown:
        accepted = None  # gave up while an earlier call may have stored it
    entry = {
        "chat": msg.chat, "seq": msg.seq, "key": msg.key, "kind": msg.kind, "type": msg.type,
        "accepted": accepted, "task_id": last.task_id or "", "reason": last.reason or "",
        "duplicate": bool(last.duplicate), "calls": tries.calls, "slowest_s": round(tries.slowest, 3),
        "unknown_seen": tries.unknown, "t": round(first, 3), "done": round(ended, 3),
        "last_s": round(tries.took, 4), "first": tries.first_reason,
        "detail": (last.detail or "")[:200] if not last.accepted else "",
        "scheduled_ms": due * 1000, "started_ms": first * 1000, "done_ms": ended * 1000,
    }
    if chunk:
        entry["chunk"] = chunk  # items in the dispatch_many call that first sent it
    return entry


def dispatch_chunk(dispatch_many: DispatchMany, chunk: Sequence[Message], *, dues: Sequence[float],
                   retry_for: float, timeout: float) -> list[dict]:
    """Dispatch ``chunk`` (one type) in one ``dispatch_many`` call; its history entries, in order.

    Items answered ``unavailable`` are sent again together, with the same keys,
    for ``retry_for`` s, as :func:`dispatch_one` does for one message. Unlike
    one message at a time, a retried item may then be stored after a later
    item of its chat that was accepted the first time: callers that need chat
    order under Redis failures send one message at a time (the fault campaign).
    """
    first = time.time()
    tries = [_Tries() for _ in chunk]
    ended = [first] * len(chunk)
    todo = list(range(len(chunk)))
    while True:
        started = time.monotonic()
        results = dispatch_many(chunk[0].type, [(chunk[i].payload, chunk[i].options(timeout)) for i in todo],
                                timeout=timeout)
        took = time.monotonic() - started
        now = time.time()
        again = []
        for i, result in zip(todo, results, strict=True):
            tries[i].answered(result, took)
            ended[i] = now
            if result.reason == "unavailable":
                again.append(i)
        todo = again
        if not todo or retry_for <= 0 or time.time() - first > retry_for:
            break
        time.sleep(RETRY_PAUSE_S)
    return [_entry(msg, t, due=due, first=first, ended=end, chunk=len(chunk))
            for msg, t, due, end in zip(chunk, tries, dues, ended, strict=True)]


def send(schedules: Sequence[Schedule], *, admit: Admit, start: float, rate: float, record: Callable[[dict], None],
         stop: threading.Event, retry_for: float, timeout: float, name: str = "loadgen-sender") -> None:
    """Run one sender thread per schedule until every schedule is done (or ``stop``); ``record`` each entry."""

    def sender(next_message: Schedule) -> None:
        while not stop.is_set():
            msg = next_message()
            if msg is None:
                return
            due = start + msg.index / rate
            delay = due - time.time()
            if delay > 0 and stop.wait(delay):
                return
            record(dispatch_one(admit, msg, due=due, retry_for=retry_for, timeout=timeout))

    _run_senders(sender, schedules, name)


def _run_senders(sender: Callable[[Schedule], None], schedules: Sequence[Schedule], name: str) -> None:
    """One thread per schedule, until every schedule is sent (or stopped)."""
    threads = [threading.Thread(target=sender, args=(s,), name=f"{name}-{j}", daemon=True)
               for j, s in enumerate(schedules)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def send_bulk(schedules: Sequence[Schedule], *, dispatch_many: DispatchMany, bulk: int, start: float, rate: float,
              record: Callable[[dict], None], stop: threading.Event, retry_for: float, timeout: float,
              name: str = "loadgen-bulk") -> None:
    """As :func:`send`, each sender sending with ``dispatch_many``: a chunk is what is due when it goes (<= bulk).

    The schedule stays open loop: a sender waits for its next message's due
    time, then takes every later message of its schedule already due (up to
    ``bulk``, of the same type) and sends them in one call, in schedule order,
    so each chat's messages keep their order.
    """
    most = max(1, int(bulk))

    def sender(next_message: Schedule) -> None:
        pending = next_message()
        while pending is not None and not stop.is_set():
            due = start + pending.index / rate
            delay = due - time.time()
            if delay > 0 and stop.wait(delay):
                return
            chunk, dues = [pending], [due]
            pending = next_message()
            now = time.time()
            while (pending is not None and len(chunk) < most and pending.type == chunk[0].type
                   and start + pending.index / rate <= now):
                chunk.append(pending)
                dues.append(start + pending.index / rate)
                pending = next_message()
            for entry in dispatch_chunk(dispatch_many, chunk, dues=dues, retry_for=retry_for, timeout=timeout):
                record(entry)

    _run_senders(sender, schedules, name)


def planned(messages: Sequence[Message]) -> Schedule:
    """A schedule of messages planned ahead, sent in the order given."""
    it = iter(messages)
    return lambda: next(it, None)


# -- the fault campaign's subprocess ----------------------------------------------------------


def _setup() -> None:
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchsite.settings")
    import django

    django.setup()


class History:
    """The history file: one JSON line per message, written by every thread."""

    def __init__(self, path: Path) -> None:
        self.fh = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def write(self, entry: dict) -> None:
        line = json.dumps(entry, separators=(",", ":"))
        with self.lock:
            self.fh.write(line + "\n")


def ticket_schedules(spec: dict, t0: float) -> list[Schedule]:
    """The campaign's schedule: a shared ticket counter sets due times; each thread sends its chats in turn."""
    run, n_chats, rate = spec["run"], int(spec["chats"]), float(spec["rate"])
    end = t0 + float(spec["duration"])
    n_threads = int(spec.get("threads", 8))
    mix = spec["mix"]
    plan = [k for k in mix for _ in range(int(k.get("weight", 1)))]
    chats = [f"{run}-c{i}" for i in range(n_chats)]
    ticket_lock = threading.Lock()
    counter = {"n": 0}

    def schedule(index: int) -> Schedule:
        mine = chats[index::n_threads]
        seqs = dict.fromkeys(mine, 0)
        turn = {"n": 0}

        def next_message() -> Message | None:
            if not mine:
                return None
            with ticket_lock:
                n = counter["n"]
                counter["n"] += 1
            if t0 + n / rate >= end:
                return None
            chat = mine[turn["n"] % len(mine)]
            turn["n"] += 1
            seq = seqs[chat]
            seqs[chat] += 1
            kind = plan[n % len(plan)]
            payload = {**kind.get("payload", {}), "run": run, "chat": chat, "seq": seq}
            return Message(n, kind["type"], chat, seq, f"{run}:{chat}:{seq}", payload, kind.get("kind", "ok"))

        return next_message

    return [schedule(i) for i in range(n_threads)]


def constant_rate(spec: dict, history: History, stop: threading.Event) -> None:
    from tasks.dispatch import admit

    t0 = time.time()
    send(ticket_schedules(spec, t0), admit=admit, start=t0, rate=float(spec["rate"]), record=history.write,
         stop=stop, retry_for=float(spec.get("retry_for", 60)), timeout=CAMPAIGN_TIMEOUT_S)


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
