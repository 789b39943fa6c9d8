"""``lanes.latch.Latch`` answers as ``threading.Event`` does, for an event that is never cleared."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanes.latch import Latch

#: One thread's steps: a wait with a timeout (0 or less: a look), ``is_set``, or a ``set``.
STEP = st.one_of(st.sampled_from([("wait", 0.0), ("wait", 0.001), ("is_set", None), ("wait", -1.0)]),
                 st.just(("set", None)))


@given(st.lists(STEP, max_size=12))
def test_one_thread_sees_what_an_event_would(steps):
    latch, event = Latch(), threading.Event()
    done = False
    for op, timeout in steps:
        if op == "set":
            latch.set()
            event.set()
            done = True
        elif op == "is_set":
            assert latch.is_set() == event.is_set()
        else:
            assert latch.wait(timeout) == event.wait(timeout)
    assert latch.wait(0) == event.wait(0) == done


@pytest.mark.parametrize("waiters", [1, 8])
def test_every_waiter_wakes_on_the_set_and_later_waits_pass_at_once(waiters):
    latch = Latch()
    answers: list[bool] = []
    lock = threading.Lock()

    def wait() -> None:
        got = latch.wait(30)
        with lock:
            answers.append(got)

    threads = [threading.Thread(target=wait) for _ in range(waiters)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    assert answers == []  # nobody passes an unset latch
    latch.set()
    for thread in threads:
        thread.join(10)
    assert answers == [True] * waiters
    assert latch.wait(0) and latch.wait(None) and latch.wait(5)


def test_a_wait_on_an_unset_latch_times_out_false():
    latch = Latch()
    started = time.monotonic()
    assert latch.wait(0.05) is False
    assert time.monotonic() - started >= 0.04
    assert not latch.is_set()


def _set_when_released(latch: Latch, barrier: threading.Barrier) -> None:
    barrier.wait()
    latch.set()


def test_sets_from_many_threads_at_once_set_it_once():
    for _ in range(200):
        latch = Latch()
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=_set_when_released, args=(latch, barrier)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert latch.is_set() and latch.wait(0)
