"""``lanes.jsontext.dumps`` writes what ``json.dumps`` writes, and refuses what it refuses, with orjson."""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import uuid
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes import jsontext


def reference(value):
    """The standard library's own call, untouched by anything in lanes.jsontext."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")
    return text


def outcome(encode, value):
    try:
        return "ok", encode(value)
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        return "error", type(exc).__name__


class Colour(enum.Enum):
    RED = 1


class Size(enum.IntEnum):
    BIG = 3


class Tag(str):
    pass


scalars = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70) | st.floats()
           | st.floats(-1e-3, 1e-3) | st.text(max_size=12)
           | st.sampled_from([Colour.RED, Size.BIG, Tag("t"), uuid.UUID(int=7), datetime.date(2026, 12, 1),
                              float("nan"), float("-inf"), 1e-5, 1.234e-7, 1e16, -0.0, "\ud800", "a\x00b"]))
keys = st.text(max_size=8) | st.integers(-5, 5) | st.booleans() | st.none() | st.floats(allow_nan=False)
values = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
                   | st.dictionaries(keys, inner, max_size=4)
                   | st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=16,
)


@settings(max_examples=400, deadline=None)
@given(value=values)
def test_the_text_and_the_refusals_are_json_dumps(value):
    assert outcome(jsontext.dumps, value) == outcome(reference, value)


@pytest.mark.parametrize("value", [
    {"x": float("nan")}, {"x": float("inf")}, {"x": uuid.UUID(int=1)}, {"x": Colour.RED}, {"x": {1, 2}},
    {"x": b"\xff"}, {"x": "\udcff"}, {"x": 10**4999}, {"x": datetime.datetime(2026, 12, 1)},
])
def test_what_json_refuses_is_refused(value):
    assert outcome(jsontext.dumps, value) == outcome(reference, value) and outcome(reference, value)[0] == "error"


@pytest.mark.parametrize("value", [
    {2: "a", None: "b", True: "c", 2.5: "d"}, {"x": 2**64}, {"x": -2**63 - 1}, {"x": (1, 2)}, {"x": Size.BIG},
    {"x": Tag("t")}, OrderedDict(a=1), {"x": [1e-5, 7e-7, 1.5e-9, 1e-10, 0.0001, 1e16]},
    {"deep": json.loads("[" * 300 + "]" * 300)}, {"é": "✓ \u2028 \x7f \x1f </"},
])
def test_what_orjson_writes_otherwise_is_written_as_json_does(value):
    assert jsontext.dumps(value) == reference(value)


def test_a_cycle_is_refused():
    looped: dict = {}
    looped["self"] = looped
    assert outcome(jsontext.dumps, looped) == ("error", "RecursionError")


def test_plain_values_are_written_by_orjson(monkeypatch):
    """The standard library is the fallback, not the path: a plain payload never reaches it."""
    def fail(value):
        raise AssertionError(f"fell back for {value!r}")

    monkeypatch.setattr(jsontext, "reference_dumps", fail)
    payload = {"to": "+15550001234", "text": "héllo, e-mail", "n": [1, 2.5, None, True], "m": {"k": "v"}}
    assert jsontext.dumps(payload) == reference(payload)


# -- kombu's JSON (a result row's columns) --------------------------------------------------------------------

class Reduced:
    def __json__(self):
        return {"reduced": True}


kombu_scalars = scalars | st.sampled_from([
    b"bytes", b"\xff\xfe", datetime.datetime(2026, 12, 1, 5, 6, 7), datetime.time(1, 2), uuid.UUID(int=9),
    decimal.Decimal("1.25"), Reduced(), {1, 2}, object(),
])
kombu_values = st.recursive(
    kombu_scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
                   | st.dictionaries(keys, inner, max_size=4)),
    max_leaves=16,
)


def kombu_outcome(value):
    from kombu.utils import json as kombu_json

    try:
        return "ok", kombu_json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return "error", type(exc).__name__


@settings(max_examples=400, deadline=None)
@given(value=kombu_values)
def test_kombu_text_is_kombus_own_or_none(value):
    text = jsontext.kombu_text(value)
    if text is None:  # left to kombu's call: one it writes with its default hook, or refuses
        return
    assert ("ok", text) == kombu_outcome(value)


@pytest.mark.parametrize("value", [None, "x", 1, 2.5, float("nan"), [1, "a", None], {"a": {"b": (1, 2)}}, {2: True}])
def test_kombu_text_writes_what_json_takes(value):
    assert ("ok", jsontext.kombu_text(value)) == kombu_outcome(value)


@pytest.mark.parametrize("value", [b"x", datetime.datetime(2026, 12, 1), uuid.UUID(int=1), Reduced(), {"x": {1}}])
def test_kombu_text_leaves_to_kombu_what_needs_its_hook(value):
    assert jsontext.kombu_text(value) is None
