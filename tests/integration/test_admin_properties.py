"""Property tests of the admin add forms (issue 13): any input is saved and round-trips, or refused naming a field.

Posted through Django's test client, which re-raises a view's exception: a 500
fails the test with its traceback. Examples are bounded (``HYPOTHESIS_EXAMPLES``,
default 40 per form) and derandomized when ``CI`` is set. The database is the
session's (SQLite by default; ``TEST_DATABASE_URL`` points the whole session at
PostgreSQL, as test_admin_properties_on_postgres does).
"""

from __future__ import annotations

import json
import math
import os
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lanes.models import Lane
from tasks.models import RetryPolicy, TaskType
from tests.support.helpers import define, unique

SETTINGS = settings(
    max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "40")),
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    database=None if os.environ.get("CI") else settings.default.database,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: Any text: every Unicode category Hypothesis draws (surrogates cannot be posted), NUL included.
ANY_TEXT = st.text(max_size=300) | st.text(alphabet=st.sampled_from("\x00\u202e\ufeff\u0301 a\t\n"), max_size=20)
HUGE = [str(2**63), str(-(2**63) - 1), str(10**30), "1e400", "-1e400", "nan", "inf", "-0", "1_000", " 7 ", ""]
NUMBER = (st.integers(min_value=-(2**70), max_value=2**70).map(str)
          | st.floats(allow_nan=True, allow_infinity=True).map(repr) | st.sampled_from(HUGE) | ANY_TEXT)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
OPTIONS = (JSON_VALUES.map(json.dumps)
           | st.fixed_dictionaries({"url": st.sampled_from(["http://127.0.0.1:9/x", "ftp://x", "http://evil.example/"])},
                                   optional={"headers": JSON_VALUES, "urll": st.text(max_size=10)}).map(json.dumps)
           | st.sampled_from(['{"url": ', "NaN", "[1,", "{'a': 1}", "\x00", "1e999", '"\\ud800"'])
           | ANY_TEXT)


def _name(prefix: str, alphabet: str) -> st.SearchStrategy[str]:
    """A unique valid name most of the time, anything else otherwise."""
    valid = st.text(alphabet=alphabet, min_size=1, max_size=12).map(lambda s: f"{unique(prefix)}{s}")
    return valid | ANY_TEXT


@pytest.fixture(scope="module")
def client() -> Client:
    user = get_user_model().objects.create_superuser(unique("prop"), "p@x", "pw-prop-12345")
    c = Client()
    c.force_login(user)
    return c


@pytest.fixture(scope="module")
def refs():
    tt = define(unique("prop-base"))
    return {"lane": str(tt.lane_id), "retry_policy": str(tt.retry_policy_id)}


def _fields_in_error(html: str) -> list[str]:
    """The fields whose rows the admin marks as in error (``form-row errors ... field-<name>``)."""
    return re.findall(r'class="form-row errors[^"]*?field-(\w+)', html)


def _post(client: Client, model, url: str, data: dict) -> tuple[int, object | None, str]:
    before = model.objects.count()
    response = client.post(url, data)
    event(f"HTTP {response.status_code}")
    html = response.content.decode()
    after = model.objects.count()
    if response.status_code == 302:
        assert after == before + 1, "saved, but not exactly one new row"
        return 302, model.objects.order_by("-pk").first(), html
    assert response.status_code == 200, response.status_code
    assert after == before, "refused, yet a row was written"
    assert 'class="errornote"' in html, "a 200 without an error note"
    named = _fields_in_error(html)
    assert named and set(named) <= set(data), f"refused without naming a posted field: {named}"
    return 200, None, html


def _int(posted: str) -> int:
    """What Django's IntegerField makes of a posted text (it drops a trailing ``.0``)."""
    return int(re.sub(r"\.0*\s*$", "", posted.strip()))


def _close(saved: float, posted: str) -> bool:
    value = float(posted.strip())
    return math.isclose(saved, value, rel_tol=1e-12, abs_tol=0.0)


def _draw(data, valid: dict, wild: dict) -> dict:
    """Each field valid, except a drawn few (often none) that get anything: so some rows save and round-trip."""
    broken = data.draw(st.sets(st.sampled_from(sorted(valid)), max_size=3), label="broken fields")
    return {name: data.draw(wild[name] if name in broken else valid[name], label=name) for name in valid}


def _num(low: float, high: float, integer: bool = True) -> st.SearchStrategy[str]:
    if integer:
        return st.integers(min_value=int(low), max_value=int(high)).map(str)
    return st.floats(min_value=low, max_value=high, allow_nan=False).map(repr)


@SETTINGS
@given(data=st.data(), accepting=st.booleans())
def test_lane_add_form(client, data, accepting):
    form = _draw(data, valid={"name": _name("pl-", "abcXYZ019_.-").filter(lambda n: n.startswith("pl-")),
                              "capacity": _num(1, 10**9), "description": st.text(
                                  alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=50)},
                 wild={"name": ANY_TEXT, "capacity": NUMBER, "description": ANY_TEXT})
    if accepting:
        form["accepting"] = "on"
    status, row, _ = _post(client, Lane, "/admin/lanes/lane/add/", form)
    if status == 302:
        assert row.name == form["name"].strip() and row.capacity == _int(form["capacity"])
        assert row.accepting is accepting and row.description == form["description"].strip()
        row.full_clean()


@SETTINGS
@given(data=st.data())
def test_retry_policy_add_form(client, data):
    form = _draw(data, valid={"name": _name("pr-", "abcXYZ019_.-").filter(lambda n: n.startswith("pr-")),
                              "max_retries": _num(0, 100), "initial_backoff": _num(0, 10, False),
                              "multiplier": _num(1, 100, False), "max_backoff": _num(10, 86400, False),
                              "jitter": _num(0, 1, False)},
                 wild=dict.fromkeys(("max_retries", "initial_backoff", "multiplier", "max_backoff", "jitter"),
                                    NUMBER) | {"name": ANY_TEXT})
    status, row, _ = _post(client, RetryPolicy, "/admin/tasks/retrypolicy/add/", form)
    if status == 302:
        assert row.name == form["name"].strip() and row.max_retries == _int(form["max_retries"])
        for field in ("initial_backoff", "multiplier", "max_backoff", "jitter"):
            assert _close(getattr(row, field), form[field]), field
        row.full_clean()  # what was saved passes the model's own checks


@SETTINGS
@given(data=st.data(), enabled=st.booleans(), chat_scoped=st.booleans())
def test_task_type_add_form(client, refs, data, enabled, chat_scoped):
    form = _draw(data, valid={
        "name": _name("pt.", "abcXYZ019_.:-").filter(lambda n: n.startswith("pt.")),
        "handler": st.sampled_from(["demo.echo", "http.post"]), "priority": _num(0, 9),
        "timeout": _num(100, 3600, False), "attempt_timeout": _num(0.01, 100, False),
        "options": st.just(json.dumps({"url": "http://127.0.0.1:9/x"})), "chat_queue_size": _num(1, 100000),
        "max_payload_bytes": _num(2, 8 * 1024 * 1024), "idempotency_window": _num(0, 10**6),
        "dedupe": st.sampled_from(["key", "throttle", "debounce"]), "dedupe_window": _num(0.001, 99, False),
    }, wild={
        "name": ANY_TEXT, "handler": st.sampled_from(["os.system", "demo.echo "]) | ANY_TEXT, "priority": NUMBER,
        "timeout": NUMBER, "attempt_timeout": NUMBER, "options": OPTIONS, "chat_queue_size": NUMBER,
        "max_payload_bytes": NUMBER, "idempotency_window": NUMBER,
        "dedupe": st.sampled_from(["Throttle", "sometimes", "", "debounce "]) | ANY_TEXT, "dedupe_window": NUMBER,
    })
    if form["handler"] == "demo.echo" and form["options"] == json.dumps({"url": "http://127.0.0.1:9/x"}):
        form["options"] = "{}"  # demo.echo declares no options: only a broken draw should send some
    form.update(refs)
    if enabled:
        form["enabled"] = "on"
    if chat_scoped:
        form["chat_scoped"] = "on"
    status, row, _ = _post(client, TaskType, "/admin/tasks/tasktype/add/", form)
    if status == 302:
        assert row.name == form["name"].strip() and row.handler == form["handler"]
        assert row.priority == _int(form["priority"])
        assert row.options == json.loads(form["options"]) and isinstance(row.options, dict)
        assert _close(row.timeout, form["timeout"]) and _close(row.attempt_timeout, form["attempt_timeout"])
        assert row.attempt_timeout <= row.timeout
        assert row.enabled is enabled and row.chat_scoped is chat_scoped
        assert row.dedupe == (form["dedupe"] or "key")
        if row.dedupe != "key":
            assert 0 < row.dedupe_window < row.timeout or row.dedupe == "throttle"
        row.full_clean()


@pytest.fixture(scope="module")
def schedule_refs():
    from django_celery_beat.models import IntervalSchedule

    tt = define(unique("prop-sched"))
    interval, _ = IntervalSchedule.objects.get_or_create(every=90, period="seconds")
    return {"task_type": str(tt.pk), "interval": str(interval.pk)}


def _as_floats(value):
    """``value`` with every number a float (bools kept), to compare JSON as numbers, not as Python types."""
    if isinstance(value, dict):
        return {k: _as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


@SETTINGS
@given(data=st.data(), enabled=st.booleans())
def test_schedule_add_form(client, schedule_refs, data, enabled):
    from tasks.models import Schedule

    payloads = st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3).map(json.dumps)
    form = _draw(data, valid={
        "name": _name("ps.", "abcXYZ019_.:-").filter(lambda n: n.startswith("ps.")),
        "task_type": st.just(schedule_refs["task_type"]), "interval": st.just(schedule_refs["interval"]),
        "payload": payloads, "priority": st.just("") | _num(0, 9), "missed": st.sampled_from(["once", "skip"]),
        "chat_id": st.text(alphabet="abc-019", max_size=10), "limit_key": st.text(alphabet="xyz_5", max_size=10),
    }, wild={
        "name": ANY_TEXT, "task_type": st.sampled_from(["0", "-1", "x", ""]) | ANY_TEXT,
        "interval": st.sampled_from(["0", "", "abc"]) | ANY_TEXT, "payload": OPTIONS, "priority": NUMBER,
        "missed": st.sampled_from(["burst", "", "ONCE"]) | ANY_TEXT, "chat_id": ANY_TEXT, "limit_key": ANY_TEXT,
    })
    form.update({"crontab": "", "clocked": ""})
    if enabled:
        form["enabled"] = "on"
    status, row, _ = _post(client, Schedule, "/admin/tasks/schedule/add/", form)
    if status == 302:
        assert row.name == form["name"].strip() and str(row.task_type_id) == form["task_type"]
        # PostgreSQL's jsonb keeps a number as its decimal value: 3.602879701896397e+16 reads back as the int
        # 36028797018963970, the same number as a float.
        assert isinstance(row.payload, dict)
        assert _as_floats(row.payload) == _as_floats(json.loads(form["payload"] or "{}"))
        assert row.priority == (_int(form["priority"]) if form["priority"].strip() else None)
        assert row.missed == form["missed"] and row.enabled is enabled
        assert row.periodic_task is not None and row.periodic_task.enabled is enabled
        row.full_clean()
