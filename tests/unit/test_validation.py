from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes.priorities import from_kombu, to_kombu
from tasks.reasons import REJECTION_REASONS
from tasks.validation import Invalid, check_dispatch

BASE = dict(type_name="t", enabled=True, chat_scoped=False, max_payload_bytes=100, default_priority=5,
            default_timeout_s=60.0, payload={"a": 1}, priority=None, timeout=None, chat_id=None,
            idempotency_key=None, metadata=None)


def reason_of(**overrides) -> str:
    with pytest.raises(Invalid) as err:
        check_dispatch(**{**BASE, **overrides})
    assert err.value.reason in REJECTION_REASONS
    assert err.value.detail
    return err.value.reason


def test_valid_dispatch_fills_defaults():
    checked = check_dispatch(**BASE)
    assert checked.priority == 5 and checked.timeout_s == 60.0 and checked.chat_id == ""
    assert checked.payload_json == '{"a":1}'


@pytest.mark.parametrize("overrides, reason", [
    ({"enabled": False}, "type_disabled"),
    ({"payload": [1, 2]}, "invalid_payload"),
    ({"payload": "text"}, "invalid_payload"),
    ({"payload": None}, "invalid_payload"),
    ({"payload": {"x": float("nan")}}, "invalid_payload"),
    ({"payload": {"x": object()}}, "invalid_payload"),
    ({"payload": {"x": "\udcff bad utf-8"}}, "invalid_payload"),
    ({"payload": {"x": "y" * 200}}, "payload_too_large"),
    ({"priority": 10}, "invalid_priority"),
    ({"priority": -1}, "invalid_priority"),
    ({"priority": "5"}, "invalid_priority"),
    ({"priority": True}, "invalid_priority"),
    ({"priority": 2.5}, "invalid_priority"),
    ({"timeout": 0}, "invalid_timeout"),
    ({"timeout": -3}, "invalid_timeout"),
    ({"timeout": float("inf")}, "invalid_timeout"),
    ({"timeout": 10**9}, "invalid_timeout"),
    ({"timeout": "60"}, "invalid_timeout"),
    ({"chat_scoped": True}, "invalid_chat_id"),
    ({"chat_id": ""}, "invalid_chat_id"),
    ({"chat_id": "x" * 129}, "invalid_chat_id"),
    ({"chat_id": "a\x00b"}, "invalid_chat_id"),
    ({"chat_id": "line\nbreak"}, "invalid_chat_id"),
    ({"chat_id": 42}, "invalid_chat_id"),
    ({"idempotency_key": ""}, "invalid_idempotency_key"),
    ({"idempotency_key": "k\x00"}, "invalid_idempotency_key"),
    ({"metadata": [1]}, "invalid_metadata"),
    ({"metadata": {"big": "z" * 5000}}, "invalid_metadata"),
])
def test_each_bad_input_has_its_reason(overrides, reason):
    assert reason_of(**overrides) == reason


def test_unicode_payload_is_measured_in_bytes():
    # 40 characters, but 120 bytes of UTF-8 (plus the JSON around them) > 100.
    with pytest.raises(Invalid) as err:
        check_dispatch(**{**BASE, "payload": {"x": "€" * 40}})
    assert err.value.reason == "payload_too_large"


def test_priority_mapping_puts_urgent_first_in_kombu_order():
    assert to_kombu(9) == 0 and to_kombu(0) == 9
    assert [from_kombu(to_kombu(p)) for p in range(10)] == list(range(10))
    # kombu pops lower numbers first: higher API priority must map lower.
    assert sorted(range(10), key=to_kombu) == list(range(9, -1, -1))
    with pytest.raises(ValueError):
        to_kombu(10)


def test_an_envelope_round_trips_every_field():
    from dataclasses import asdict

    from lanes.messages import Envelope

    env = Envelope(type="t", lane="l", priority=3, attempt=2, deadline=10.5, dispatched_at=1.25, chat="c",
                   key="k", meta={"trace": "x"}, policy="one-shot", due=11.5,
                   trace={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert env.as_dict() == asdict(env)  # the hand-written form misses no field
    assert Envelope.from_dict(env.as_dict()) == env
    # No retry policy named: the message carries no policy field (a plain dispatch's message is as before).
    plain = Envelope(type="t", lane="l", priority=3, attempt=1, deadline=10.5, dispatched_at=1.25)
    assert not {"policy", "due", "trace"} & set(plain.as_dict()) and Envelope.from_dict(plain.as_dict()) == plain
    assert (plain.ready_at, env.ready_at) == (1.25, 11.5)
    with pytest.raises(ValueError, match="'policy'"):
        Envelope.from_dict({**env.as_dict(), "policy": 3})
    for bad in ("00-x", {"traceparent": 1}, {str(i): "" for i in range(9)}, {"tracestate": "x" * 513}):
        with pytest.raises(ValueError, match="'trace'"):
            Envelope.from_dict({**env.as_dict(), "trace": bad})


# --- text no database can store (issue 12: a dead letter that cannot be written) -----------

def detail_of(**overrides) -> tuple[str, str]:
    with pytest.raises(Invalid) as err:
        check_dispatch(**{**BASE, "max_payload_bytes": 10_000, **overrides})
    return err.value.reason, err.value.detail


@pytest.mark.parametrize("overrides, reason, where", [
    ({"payload": {"a": "x\x00y"}}, "invalid_payload", "payload.a contains U+0000"),
    ({"payload": {"items": [{"text": "ok"}, {"text": "ok"}, {}, {"text": "nul\x00"}]}},
     "invalid_payload", "payload.items[3].text contains U+0000"),
    ({"payload": {"deep": [[[["\x00"]]]]}}, "invalid_payload", "payload.deep[0][0][0][0] contains U+0000"),
    ({"payload": {"k\x00": 1}}, "invalid_payload", "payload has a key 'k\\x00' containing U+0000"),
    ({"payload": {"nested": {"bad\x00key": 1}}}, "invalid_payload", "payload.nested has a key"),
    ({"payload": {"a b": ["\ud800"]}}, "invalid_payload", "payload['a b'][0] contains a lone surrogate U+D800"),
    ({"payload": {"\udcff": 1}}, "invalid_payload", "payload has a key '\\udcff' containing a lone surrogate"),
    ({"metadata": {"trace": "\x00"}}, "invalid_metadata", "metadata.trace contains U+0000"),
    ({"metadata": {"tags": ["a", "\udfff"]}}, "invalid_metadata", "metadata.tags[1] contains a lone surrogate"),
    ({"metadata": {"\x00": "v"}}, "invalid_metadata", "metadata has a key"),
])
def test_nul_and_lone_surrogates_are_refused_naming_the_path(overrides, reason, where):
    got_reason, detail = detail_of(**overrides)
    assert got_reason == reason
    assert where in detail


def test_text_that_only_looks_like_nul_is_accepted():
    # A literal backslash-u0000 (six characters) is ordinary text: stored fine everywhere.
    checked = check_dispatch(**{**BASE, "payload": {"a": "\\u0000"}, "metadata": {"m": "\\u0000"}})
    assert checked.payload_json == '{"a":"\\\\u0000"}'


def test_scrub_text_makes_any_text_storable():
    from tasks.validation import scrub_text

    assert scrub_text("a\x00b\ud800c") == "a\\x00b\\ud800c"
    scrub_text("\udcff").encode("utf-8")


def test_a_payload_that_holds_itself_is_refused_not_raised():
    """Neither encoder checks for cycles (``lanes.jsontext``): orjson stops at its depth limit, the standard
    library's recurses to RecursionError, which validation turns into a rejection like any value that is not JSON."""
    payload: dict = {"a": 1}
    payload["self"] = payload
    with pytest.raises(Invalid) as err:
        check_dispatch(**{**BASE, "payload": payload, "max_payload_bytes": 10_000})
    assert err.value.reason == "invalid_payload" and "payload is not valid JSON" in err.value.detail
    looped: list = []
    looped.append(looped)
    assert reason_of(metadata={"m": looped}) == "invalid_metadata"
    assert check_dispatch(**BASE).payload_json == '{"a":1}'  # the encoder still works after the recursion


# --- Envelope.from_dict: its checks, as they were written first ------------------------------

def _reference_from_dict(data):
    """The parse as first written (a dict of expected types built a call, ``isinstance(value, bool)``, the
    fields gathered by a comprehension): ``Envelope.from_dict`` must accept and refuse exactly as it did."""
    from lanes.messages import Envelope, _check_trace

    if not isinstance(data, dict):
        raise ValueError("the 'dispatch' argument must be an object")
    expected = {"type": str, "lane": str, "priority": int, "attempt": int,
                "deadline": (int, float), "dispatched_at": (int, float), "chat": str, "key": str}
    for name, kind in expected.items():
        value = data.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"field '{name}' is missing or has the wrong type")
    meta = data.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise ValueError("field 'meta' must be an object")
    if not isinstance(data.get("policy", ""), str):
        raise ValueError("field 'policy' must be a string")
    due = data.get("due", 0.0)
    if not isinstance(due, (int, float)) or isinstance(due, bool):
        raise ValueError("field 'due' must be a number")
    if data["attempt"] < 1 or not 0 <= data["priority"] <= 9:
        raise ValueError("field 'attempt' or 'priority' is out of range")
    _check_trace(data.get("trace"))
    return Envelope(**{name: data[name] for name in (*expected, "meta", "policy", "due", "trace") if name in data})


def _parsed(parse, data):
    try:
        return "ok", parse(data)
    except ValueError as exc:
        return "error", str(exc)


_field_values = (st.none() | st.booleans() | st.integers(-3, 12) | st.floats(allow_nan=False) | st.text(max_size=4)
                 | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)
                 | st.lists(st.integers(), max_size=2))
_good = {"type": st.text(max_size=5), "lane": st.text(max_size=5), "priority": st.integers(0, 9),
         "attempt": st.integers(1, 5), "deadline": st.floats(0, 1e10), "dispatched_at": st.integers(0, 10**10),
         "chat": st.text(max_size=3), "key": st.text(max_size=3), "meta": st.none() | st.just({"a": 1}),
         "policy": st.text(max_size=4), "due": st.floats(0, 1e10), "trace": st.none() | st.just({"traceparent": "x"})}


@st.composite
def _envelopes(draw):
    data = {}
    for name, good in _good.items():
        choice = draw(st.sampled_from(["good", "good", "good", "bad", "absent"]))
        if choice != "absent":
            data[name] = draw(good if choice == "good" else _field_values)
    if draw(st.booleans()):
        data["extra"] = draw(_field_values)  # an unknown field is ignored
    return data


@settings(max_examples=500, deadline=None)
@given(data=_envelopes() | _field_values)
def test_an_envelope_is_parsed_and_refused_as_it_was(data):
    from lanes.messages import Envelope

    assert _parsed(Envelope.from_dict, data) == _parsed(_reference_from_dict, data)
