"""A frozen Redis (SIGSTOP): every dispatch call answers within its own bound, whatever the others wait for."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis
from django.test import override_settings

from tests.support.helpers import define, unique, wait_until

TIMEOUT_S = 0.5  # DISPATCH_REDIS_TIMEOUT_S here
CALLS = 8  # the fault campaign's load generator's threads


@pytest.fixture
def short_timeout():
    from lanes.redis_client import reset_redis

    with override_settings(DISPATCH_REDIS_TIMEOUT_S=TIMEOUT_S):
        reset_redis()
        yield
    reset_redis()


def _answers(rc) -> bool:
    try:
        return bool(rc.ping())
    except redis.RedisError:
        return False


def test_calls_of_a_process_without_a_config_each_answer_within_the_bound(rc, redis_server, short_timeout,
                                                                         monkeypatch):
    """A process whose first dispatches meet a frozen Redis (it started during the freeze: the
    fault campaign's scenario 4 on a loaded host). Its calls used to queue on the configuration's
    lock, each reading Redis in turn for its full timeout: the last waited ``CALLS`` timeouts."""
    from lanes import memory_guard
    from tasks import config
    from tasks.dispatch import dispatch

    name = unique("deadline")
    define(name, handler="http.post", lane=unique("l-deadline"), options={"url": "http://127.0.0.1:9/"})
    config.forget()
    memory_guard.forget()
    answers: list[tuple[float, str, str]] = []
    lock = threading.Lock()
    go = threading.Barrier(CALLS + 1)

    def call(i: int) -> None:
        go.wait()
        started = time.monotonic()
        result = dispatch.delay(name, {"n": i}, idempotency_key=f"dl-{i}")
        with lock:
            answers.append((time.monotonic() - started, result.reason or "accepted", result.detail or ""))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(CALLS)]
    for t in threads:
        t.start()
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        go.wait()
        for t in threads:
            t.join(timeout=60)
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
        wait_until(lambda: _answers(rc), timeout=10, what="Redis answers again")
    assert len(answers) == CALLS
    assert all(reason == "unavailable" for _, reason, _ in answers), answers
    bound = 2 * TIMEOUT_S + 1.0  # the fault campaign's bound on one call
    assert max(took for took, _, _ in answers) <= bound, sorted(answers)
    config.forget()  # the next test loads it from a Redis that answers
