"""The module-end guard of tests/conftest.py finds a child process a module left running, and kills it."""

from __future__ import annotations

import os
import subprocess

from tests.support.leftovers import descendants, leaked_children


def test_a_child_left_running_is_reported_and_killed():
    before = set(descendants(os.getpid()))
    child = subprocess.Popen(["sleep", "60"])
    try:
        leaked = leaked_children(before)
        assert child.pid in leaked and "sleep 60" in leaked[child.pid], leaked
        assert child.wait(timeout=5) == -9  # killed by the guard
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_child_that_ended_or_outlives_on_purpose_is_not_reported():
    before = set(descendants(os.getpid()))
    ended = subprocess.Popen(["true"])
    ended.wait()
    kept = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])  # kept, and a grandchild below it
    try:
        assert leaked_children(before, {kept.pid}) == {}
        assert kept.poll() is None
    finally:
        kept.kill()
        kept.wait()
