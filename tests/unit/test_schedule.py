"""``tasks.schedule.due_at``: when a task sent for later is due, or why not (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from tasks.schedule import due_at
from tasks.validation import Invalid

NOW = 1_800_000_000.0
BOUNDS = {"now_s": NOW, "deadline_s": NOW + 600, "max_delay_s": 7 * 86400}


def test_countdown_and_eta_give_the_due_time():
    assert due_at(countdown=30, eta=None, **BOUNDS) == NOW + 30
    eta = datetime.fromtimestamp(NOW + 90, tz=timezone(timedelta(hours=-5)))
    assert due_at(countdown=None, eta=eta, **BOUNDS) == NOW + 90
    assert due_at(countdown=None, eta=eta.isoformat(), **BOUNDS) == NOW + 90
    assert due_at(countdown=None, eta=datetime.fromtimestamp(NOW + 5, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  **BOUNDS) == NOW + 5


def test_now_or_past_is_a_plain_dispatch():
    assert due_at(countdown=None, eta=None, **BOUNDS) is None
    assert due_at(countdown=0, eta=None, **BOUNDS) is None
    assert due_at(countdown=None, eta=datetime.fromtimestamp(NOW - 3600, tz=UTC), **BOUNDS) is None
    assert due_at(countdown=None, eta=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=23))), **BOUNDS) is None


@pytest.mark.parametrize(("countdown", "eta", "says"), [
    (1, datetime.fromtimestamp(NOW, tz=UTC), "not both"),
    (-0.5, None, "[0, 604800]"),
    (float("nan"), None, "not nan"),
    (10**400, None, "the longest delay"),
    ("5", None, "a number of seconds"),
    (None, datetime(2030, 1, 1), "is naive"),
    (None, "2030-01-01T00:00:00", "is naive"),
    (None, "x" * 100, "ISO 8601"),
    (None, datetime.fromtimestamp(NOW + 8 * 86400, tz=UTC), "the longest delay"),
    (600, None, "at or after the task's deadline"),
])
def test_refusals_are_invalid_eta_naming_what_is_wrong(countdown, eta, says):
    with pytest.raises(Invalid) as err:
        due_at(countdown=countdown, eta=eta, **BOUNDS)
    assert err.value.reason == "invalid_eta"
    assert says in err.value.detail, err.value.detail


def test_a_due_time_in_the_deadlines_last_millisecond_is_refused_as_at_the_deadline():
    """Both are stored in whole ms (truncated): due 0.2 ms before the deadline would be stored at it, and
    expire as it became due (CI: a property test met due_ms == deadline_ms)."""
    bounds = {**BOUNDS, "deadline_s": NOW + 0.5006}
    assert int((NOW + 0.5004) * 1000) == int(bounds["deadline_s"] * 1000)
    with pytest.raises(Invalid, match="at or after the task's deadline"):
        due_at(countdown=0.5004, eta=None, **bounds)
    assert due_at(countdown=0.4990, eta=None, **bounds) == NOW + 0.4990  # a millisecond before: due
    # No deadline to compare with (the HTTP API checks a caller's options before the type's timeout is known).
    assert due_at(countdown=0.5004, eta=None, **{**BOUNDS, "deadline_s": float("inf")}) == NOW + 0.5004
