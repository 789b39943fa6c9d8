"""A prefork child must not inherit a lock that another thread of the parent held.

Found in the poison test: the worker's maintenance thread was reloading the
config (holding its lock) when billiard forked a replacement child after a
crash; the child's first task then waited on that lock until its time limit.
"""

from __future__ import annotations

import os
import threading

import pytest

from lanes import leases, redis_client
from tasks import config
from tasks.handlers import http
from tools import sink

MODULES = [(config, "_lock"), (redis_client, "_lock"), (leases.LeaseBook(), "_lock"), (http, "_pool_lock"),
           (sink, "_counts_lock")]


@pytest.mark.parametrize("module, name", MODULES, ids=[getattr(m, "__name__", type(m).__name__) for m, _ in MODULES])
def test_child_gets_a_free_lock_when_a_thread_held_it_at_fork(module, name):
    held, release = threading.Event(), threading.Event()

    def holder():
        with getattr(module, name):
            held.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if the lock is free
            os._exit(0 if getattr(module, name).acquire(timeout=2) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_forked_child_finds_its_parents_lease_book_empty():
    """A prefork child must not renew, settle or report as in hand what its parent holds."""
    book = leases.LeaseBook()
    with book._lock:  # as hold/take_in_hand/settle leave it, without starting the lease thread
        book._running["rec:parent"] = 1
        book._in_hand["rec:parent"] = 1
        book._settling.append("rec:parent")
        book._beaten = True
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the book is empty and unregistered
        empty = not (book._running or book._in_hand or book._settling or book.registered())
        os._exit(0 if empty else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert book._running == {"rec:parent": 1} and book.registered()  # the parent's stays
