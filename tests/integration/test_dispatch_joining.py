"""Concurrent ``dispatch.delay`` calls of one process share round trips (``tasks.bulk.Joiner``), and each
still gets exactly its own answer. Counted (script calls Redis ran), never timed."""

from __future__ import annotations

import threading

import pytest

from lanes import keys
from tasks.dispatch import dispatch
from tests.support.helpers import define, unique

pytestmark = pytest.mark.django_db(transaction=True)

THREADS, CALLS = 8, 60


def _script_calls(rc) -> int:
    stats = rc.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


def test_eight_threads_dispatching_at_once_share_round_trips_and_each_gets_its_own_answer(rc):
    lane = unique("join")
    plain, chatty = unique("join-plain"), unique("join-chat")
    define(plain, lane=lane)
    define(chatty, lane=lane, chat_scoped=True, chat_queue_size=2)
    dispatch.delay(plain, {"warm": True})  # the config snapshot and the script are loaded
    answers: dict[tuple[int, int], object] = {}
    start = threading.Barrier(THREADS)

    def caller(t: int) -> None:
        start.wait()
        for n in range(CALLS):
            if n % 3 == 2:  # chats of their own per thread, two messages each (their queue's size)
                answers[t, n] = dispatch.delay(chatty, {"t": t, "n": n}, chat_id=f"t{t}-{n // 6}")
            else:
                answers[t, n] = dispatch.delay(plain, {"t": t, "k": n % 10}, idempotency_key=f"k{t}-{n % 10}")

    before = _script_calls(rc)
    threads = [threading.Thread(target=caller, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    calls = _script_calls(rc) - before
    total = THREADS * CALLS
    assert len(answers) == total
    # Fewer script calls than dispatches: calls waiting on one in Redis went together.
    assert calls <= total * 3 // 4, f"{calls} script calls for {total} concurrent dispatches"
    # Each caller got the answer to its own call.
    for (_t, n), result in answers.items():
        if n % 3 == 2:
            assert result.accepted and result.position == (1 if n % 6 == 2 else 2), result
        else:
            assert result.accepted, result
    # Idempotency within and across turns: a key reused by the same thread answers its first task.
    by_key: dict[str, set[str]] = {}
    for (t, n), result in answers.items():
        if n % 3 != 2:
            by_key.setdefault(f"k{t}-{n % 10}", set()).add(result.task_id)
    assert all(len(ids) == 1 for ids in by_key.values()), {k: v for k, v in by_key.items() if len(v) > 1}
    # One more for a full chat is refused, as alone.
    assert dispatch.delay(chatty, {"late": 1}, chat_id="t0-0").reason == "chat_queue_full"
    assert rc.exists(keys.chat_queue("t0-0"))
