"""The pure parts of a task's history: progress checks and attempts read from events."""

from __future__ import annotations

import math

import pytest

from tasks.history import NOTE_MAX, InvalidProgress, check_progress
from tasks.history_view import attempts_of


@pytest.mark.parametrize(("fraction", "note", "says"), [
    (1.01, None, "from 0 to 1, got 1.01"), (-0.5, None, "got -0.5"), (math.nan, None, "got nan"),
    (math.inf, None, "got inf"), ("0.5", None, "not str"), (True, None, "not bool"), (None, None, "not NoneType"),
    (0.5, 3, "note must be text, not int"), (0.5, "x" * (NOTE_MAX + 1), f"at most {NOTE_MAX}"),
    (0.5, "line\nbreak", "printable"), (0.5, "nul\x00", "printable"),
])
def test_bad_progress_is_refused_saying_what_is_wrong(fraction, note, says):
    with pytest.raises(InvalidProgress, match="progress") as refused:
        check_progress(fraction, note)
    assert says in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_good_progress_is_kept_as_given():
    assert check_progress(0) == (0.0, "")
    assert check_progress(1, "done") == (1.0, "done")
    assert check_progress(0.25, "<b>a quarter</b>") == (0.25, "<b>a quarter</b>")  # escaped where shown


def test_attempts_from_events():
    events = [
        {"kind": "dispatched", "at": 1.0},
        {"kind": "started", "attempt": 1, "at": 2.0, "worker": "w1"},
        {"kind": "started", "attempt": 1, "at": 9.0, "worker": "w2"},  # delivered again: w1 was lost
        {"kind": "retry", "attempt": 1, "at": 9.5, "error": "boom", "delay_s": 0.4},
        {"kind": "started", "attempt": 2, "at": 10.0, "worker": "w2"},
        {"kind": "succeeded", "attempt": 2, "at": 10.5},
        {"kind": "succeeded", "attempt": 2, "at": 10.6},  # a late duplicate changes nothing
    ]
    attempts = attempts_of(events)
    assert [(a.number, a.worker, a.outcome) for a in attempts] == [
        (1, "w1", "worker lost"), (1, "w2", "failed, retried"), (2, "w2", "succeeded")]
    assert attempts[1].retry_delay_s == 0.4 and attempts[1].error == "boom" and attempts[2].ended_at == 10.5


def test_a_task_no_worker_started_has_no_attempt():
    assert attempts_of([{"kind": "dispatched", "at": 1.0}, {"kind": "dead", "attempt": 1, "reason": "expired"}]) == []


def test_events_are_read_one_a_line():
    from tasks.history import _text_of, events_of

    lines = ['{"kind":"dispatched","at":1.0}', '{"kind":"started","note":"a\\nb"}']
    assert events_of(_text_of(lines).encode()) == lines
    assert events_of(_text_of(lines[:1]) + _text_of(lines[1:])) == lines  # two flushes, appended
    assert events_of(None) == [] and events_of(b"") == []
