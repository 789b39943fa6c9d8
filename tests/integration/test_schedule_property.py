"""Property: any countdown / eta / retry_policy a caller passes is accepted as it says, or refused clearly.

Real admission against the real Redis, in the caller (``dispatch.delay``) and by
name (what an ingress worker runs for ``send_task("tasks.dispatch", ...)``):
never an exception; a rejection has a reason of the closed set and a detail; an
accepted task sent for later is ``scheduled`` with the due time it was given,
and before its deadline.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from lanes import keys
from tasks import config
from tasks.dispatch import DispatchResult, admit, dispatch
from tasks.models import RetryPolicy
from tasks.reasons import REJECTION_REASONS
from tests.support.helpers import define, unique
from tests.support.hypothesis_profile import bounded

ANY_TEXT = st.text(st.characters(codec=None, categories=None, exclude_categories=[]), max_size=30)
OFFSETS = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-23,
                                                                                            minutes=-59))])
NUMBERS = (st.integers() | st.floats() | st.booleans()
           | st.floats(min_value=-5, max_value=700) | st.integers(min_value=-5, max_value=700))
DATETIMES = st.datetimes(timezones=st.none() | OFFSETS) | st.builds(
    lambda s, tz: datetime.now(tz) + timedelta(seconds=s), st.floats(-100, 10 * 86400), OFFSETS)
ETAS = DATETIMES | DATETIMES.map(lambda d: d.isoformat()) | ANY_TEXT | NUMBERS | st.lists(st.integers(), max_size=2)


@pytest.fixture(scope="module")
def door():
    name = unique("sch-prop")
    define(name, lane=unique("t-sch-prop"), timeout=600)
    RetryPolicy.objects.update_or_create(name="prop-known", defaults={"max_retries": 1})
    config.forget()
    return name


@bounded(150)
@given(
    when=st.one_of(st.tuples(NUMBERS | ANY_TEXT, st.none()), st.tuples(st.none(), ETAS),
                   st.tuples(st.floats(0, 500), st.none()),  # plausible countdowns, often accepted
                   st.tuples(st.none() | NUMBERS, st.none() | ETAS)),
    retry_policy=st.none() | st.just("prop-known") | ANY_TEXT | st.integers(),
    timeout=st.none() | st.floats(min_value=0.5, max_value=900),
    by_name=st.booleans(),
)
@example(when=(None, datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=23)))), retry_policy=None,
         timeout=None, by_name=False)
@example(when=(None, "9999-12-31T23:59:59-23:59"), retry_policy=None, timeout=None, by_name=True)
@example(when=(float("nan"), None), retry_policy="prop-known", timeout=None, by_name=True)
@example(when=(10**5000, None), retry_policy=None, timeout=None, by_name=False)
@example(when=(30, None), retry_policy="prop-known", timeout=None, by_name=True)
def test_any_schedule_options_are_accepted_or_refused_with_a_reason(redis_server, door, when, retry_policy,
                                                                    timeout, by_name):
    rc = redis_server.client()
    countdown, eta = when
    options = {"countdown": countdown, "eta": eta, "retry_policy": retry_policy, "timeout": timeout}
    before = time.time()
    if by_name:
        if isinstance(eta, datetime):
            options["eta"] = eta.isoformat()  # JSON on the wire: an ISO 8601 text
        answer = dispatch.run(door, {}, **options)
        result = DispatchResult(**answer)
    else:
        result = admit(door, {}, **options)
    after = time.time()
    event(f"rejected {result.reason}" if not result.accepted else "accepted")
    if not result.accepted:
        assert result.reason in REJECTION_REASONS and result.detail, result
        assert result.reason in ("invalid_eta", "unknown_retry_policy", "invalid_timeout"), result
        return
    assert retry_policy in (None, "prop-known"), result
    rec = rc.hgetall(keys.task_record(result.task_id))
    state = rec[b"st"].decode()
    event(f"accepted {state}")
    deadline_ms = int(rec[b"dl"])
    if state == "scheduled":
        due_ms = int(rec[b"eta"])
        assert before * 1000 - 1 <= due_ms < deadline_ms, (due_ms, before, deadline_ms)
        if countdown is not None:
            assert before * 1000 + countdown * 1000 - 2 <= due_ms <= after * 1000 + countdown * 1000 + 2
        assert rc.zscore(keys.lane_delayed(rec[b"lane"].decode()), keys.task_record(result.task_id)) == due_ms
        assert result.estimated_delay is None or result.estimated_delay >= due_ms / 1000 - after - 0.01
    else:
        assert state == "queued", state  # "now": no countdown/eta, a zero countdown or an eta already past
        assert countdown is None or countdown < 0.01, countdown
