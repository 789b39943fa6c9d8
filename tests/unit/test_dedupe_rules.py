"""The dedupe mode and window a task type may hold, and the key a dispatch goes by (``tasks.dedupe``, pure)."""

from __future__ import annotations

import pytest

from tasks import dedupe


@pytest.mark.parametrize(("mode", "window", "timeout", "field"), [
    ("key", 0, 60, None), ("throttle", 5, 60, None), ("debounce", 2.5, 60, None), ("throttle", 600, 60, None),
    ("sometimes", 1, 60, "dedupe"), ("Throttle", 1, 60, "dedupe"), (None, 1, 60, "dedupe"),
    ("throttle", 0, 60, "dedupe_window"), ("debounce", 0, 60, "dedupe_window"), ("key", -1, 60, "dedupe_window"),
    ("debounce", 60, 60, "dedupe_window"), ("throttle", 86401, 60, "dedupe_window"),
    ("throttle", True, 60, "dedupe_window"), ("throttle", "1", 60, "dedupe_window"),
    ("throttle", float("nan"), 60, "dedupe_window"),
])
def test_window_problem_names_the_field(mode, window, timeout, field):
    problem = dedupe.window_problem(mode, window, timeout)
    assert (problem[0] if problem else None) == field
    if problem:
        assert problem[1].endswith(".") and len(problem[1]) < 200


def test_the_key_a_dispatch_goes_by():
    assert dedupe.dedupe_key_of("key", "idem", "dd") == ""
    assert dedupe.dedupe_key_of("throttle", "idem", "") == "idem"
    assert dedupe.dedupe_key_of("debounce", "idem", "dd") == "dd"
    assert dedupe.keeps_idempotency("key", "idem", "")
    assert not dedupe.keeps_idempotency("throttle", "idem", "")  # the idempotency key is the dedupe key
    assert dedupe.keeps_idempotency("debounce", "idem", "dd")
    assert dedupe.replaced_detail("t1") == "replaced by t1"
