"""Property tests of the admission door (issue 12): any argument gets an answer, and what is
accepted can be stored.

``check_dispatch`` and the whole ``admit`` (real Redis, real config) are fed any JSON-like
value (every Unicode category, lone surrogates, NUL, huge and deep), non-JSON Python values,
odd chat ids, keys, priorities and timeouts. Properties:

- ``admit`` never raises: it returns a ``DispatchResult``;
- a rejection has a reason from the closed set (tasks/reasons.py) and a short, non-empty detail;
- an accepted task's payload and metadata, as the worker will read them from the published
  message, can be inserted into a real ``DeadLetter`` row on SQLite and on PostgreSQL
  (inside a transaction that is rolled back): the dead-letter path can always record it.
"""

from __future__ import annotations

import json
import math
import os
import uuid

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from tests.support.helpers import define, unique
from tests.support.hypothesis_profile import bounded
from tests.support.postgres_server import find_bindir

ADMISSION_EXAMPLES = 150
#: A rejection's detail is read by people and logged on every rejection: it stays short.
MAX_DETAIL = 500

# --- strategies -------------------------------------------------------------------------

#: Every code point, including lone surrogates (Cs) and NUL, which ``characters()`` leaves out by default.
any_char = st.characters(exclude_categories=()) | st.sampled_from(
    ["\x00", "\ud800", "\udfff", "\x7f", "\u2028", "\ufeff", "\U0010ffff", "\U0001f600", "'", '"', "\\", ":"])
any_text = st.text(any_char, max_size=40)
#: Built by ``map``: ``repr`` of an int over 4300 digits raises, even inside Hypothesis's own reprs.
huge_ints = st.sampled_from([63, 64, 400, 4299, 4300, 5000]).map(lambda e: 10**e) | st.just(-(2**63) - 1)
#: What JSON can carry (any size of int up to Python's 4300-digit limit, any finite float, any text).
json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | any_text
    | st.sampled_from([2**63, -(2**63) - 1, 2**64, 5e-324, 1.7976931348623157e308, -0.0])
)
#: Scalars admission must refuse: nan, inf, ints too long to write as text.
bad_scalars = st.floats() | huge_ints
#: Values ``json.dumps`` refuses or that are not JSON at all.
non_json = (
    st.binary(max_size=8) | st.sets(st.integers(), max_size=3) | st.frozensets(st.integers(), max_size=2)
    | st.complex_numbers(allow_nan=True) | st.builds(object) | st.decimals(allow_nan=True)
)
#: Keys ``json.dumps`` writes as strings: text, ints, bools, None, finite floats.
json_keys = any_text | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False, allow_infinity=False)
dict_keys = json_keys | st.floats() | st.tuples(st.integers()) | st.frozensets(st.integers(), max_size=2)


def json_like(leaves: st.SearchStrategy, keys: st.SearchStrategy = json_keys) -> st.SearchStrategy:
    return st.recursive(
        leaves,
        lambda children: st.lists(children, max_size=5) | st.tuples(children, children)
        | st.dictionaries(keys, children, max_size=5),
        max_leaves=25,
    )


def nested(depth: int) -> dict:
    """``{"d": [[[...]]]}``, ``depth`` lists deep (built without recursion)."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return {"d": value}


def mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` about three times in four: each argument hostile alone, so most examples get past
    the early checks and reach the ones behind them (and acceptance, and the stores)."""
    return st.sampled_from((True, True, True, False)).flatmap(lambda ok: valid if ok else hostile)


mostly_json = json_like(json_scalars)
with_non_json = json_like(json_scalars | bad_scalars | non_json, dict_keys)
objects = st.dictionaries(dict_keys, mostly_json, max_size=6) | st.dictionaries(any_text, with_non_json, max_size=4)
payloads = mostly(
    st.dictionaries(any_text, mostly_json, max_size=6),
    objects | mostly_json | non_json | bad_scalars
    | st.integers(1, 150).map(nested)
    | st.integers(60000, 70000).map(lambda n: {"big": "a" * n}),
)
metadatas = mostly(
    st.none() | st.dictionaries(any_text, mostly_json, max_size=4),
    objects | st.integers(1, 150).map(nested) | mostly_json | non_json,
)
#: Text a chat id or key may be: printable, any script (no controls, separators or surrogates).
printable_text = st.text(st.characters(exclude_categories=("C", "Zl", "Zp")), min_size=1, max_size=128)
odd_text = (
    any_text | st.text(any_char, min_size=100, max_size=260) | st.sampled_from(["", " ", "\x00", "\ud800", "a" * 128,
                                                                              "a" * 129, "a" * 200, "a" * 201])
)
chat_ids = mostly(mostly(printable_text, st.none()), odd_text | st.integers() | st.binary(max_size=4) | st.floats())
idempotency_keys = mostly(st.none() | printable_text, odd_text | st.integers() | st.binary(max_size=4))
priorities = mostly(
    st.none() | st.integers(0, 9),
    st.integers(-3, 12) | st.integers() | huge_ints | st.floats() | st.booleans() | any_text,
)
timeouts = mostly(
    st.none() | st.floats(0.001, 3600) | st.integers(1, 3600),
    st.floats() | st.integers() | huge_ints | st.booleans() | any_text
    | st.sampled_from([0, -1, 1e-300, 86400 * 365 * 100, float("nan"), float("inf"), "30"]),
)


# --- check_dispatch alone -----------------------------------------------------------------


def _check(**overrides):
    from tasks.validation import check_dispatch

    args = dict(type_name="props.pure", enabled=True, chat_scoped=False, max_payload_bytes=65536,
                default_priority=5, default_timeout_s=60.0, payload={}, priority=None, timeout=None,
                chat_id=None, idempotency_key=None, metadata=None)
    return check_dispatch(**{**args, **overrides})


@bounded(ADMISSION_EXAMPLES)
@given(payload=payloads, metadata=metadatas, priority=priorities, timeout=timeouts, chat_id=chat_ids,
       idempotency_key=idempotency_keys, chat_scoped=st.booleans())
@example(payload={}, metadata=None, priority=None, timeout=10**400, chat_id=None, idempotency_key=None,
         chat_scoped=False)  # found: math.isfinite(10**400) raised OverflowError
@example(payload={}, metadata=None, priority=10**5000, timeout=None, chat_id=None, idempotency_key=None,
         chat_scoped=False)  # found: repr() of the priority in the detail raised ValueError
def test_check_dispatch_answers_checked_or_invalid(payload, metadata, priority, timeout, chat_id, idempotency_key,
                                                    chat_scoped):
    from tasks.reasons import REJECTION_REASONS
    from tasks.validation import Checked, Invalid

    try:
        checked = _check(payload=payload, metadata=metadata, priority=priority, timeout=timeout, chat_id=chat_id,
                         idempotency_key=idempotency_key, chat_scoped=chat_scoped)
    except Invalid as exc:
        assert exc.reason in REJECTION_REASONS
        assert isinstance(exc.detail, str) and 0 < len(exc.detail) <= MAX_DETAIL
        assert "\x00" not in exc.detail and exc.detail.encode("utf-8")
        return
    assert isinstance(checked, Checked)
    assert isinstance(checked.priority, int) and 0 <= checked.priority <= 9
    assert isinstance(checked.timeout_s, float) and math.isfinite(checked.timeout_s) and checked.timeout_s > 0
    assert json.loads(checked.payload_json) is not None
    checked.payload_json.encode("utf-8")
    assert "\\u0000" not in checked.payload_json


# --- the whole admission against Redis, stored on SQLite and PostgreSQL ---------------------


@pytest.fixture(scope="module")
def prop_types(redis_server) -> dict[str, str]:
    base = unique("props")
    lane = "t-props"
    define(f"{base}.plain", lane=lane, max_payload_bytes=65536)
    define(f"{base}.chat", lane=lane, chat_scoped=True, chat_queue_size=100000)
    define(f"{base}.off", lane=lane, enabled=False)
    return {"plain": f"{base}.plain", "chat": f"{base}.chat", "off": f"{base}.off"}


@pytest.fixture(scope="module")
def redis_client(redis_server):
    """A module-scoped client (Hypothesis refuses function-scoped fixtures in a ``@given`` test)."""
    return redis_server.client()


@pytest.fixture(scope="module")
def stores():
    """Database aliases to store accepted tasks in: SQLite always, PostgreSQL when installed (always in CI)."""
    aliases = ["default"]
    server = None
    if find_bindir() is not None or os.environ.get("CI"):
        import dj_database_url
        from django.db import connections

        from tasks.models import DeadLetter
        from tests.support.postgres_server import PostgresServer

        server = PostgresServer().start()
        configured = connections.configure_settings(
            {"default": connections.settings["default"], "props_pg": dj_database_url.parse(server.url)})
        connections.settings["props_pg"] = configured["props_pg"]
        with connections["props_pg"].schema_editor() as editor:
            editor.create_model(DeadLetter)  # the real table: jsonb payload/metadata, varchar lengths
        aliases.append("props_pg")
    yield aliases
    if server is not None:
        from django.db import connections

        connections["props_pg"].close()
        del connections.settings["props_pg"]
        server.stop()


def published(rc, task_id: str, chat: str) -> tuple[object, object]:
    """The payload and metadata a worker will read from the message admission published."""
    from lanes import keys
    from lanes.messages import kombu_message

    raw = rc.hget(keys.task_record(task_id, chat or None), "msg")
    assert raw is not None, f"accepted task {task_id} has no stored message"
    message = kombu_message(raw, task_id, keys.task_record(task_id, chat or None), f"{task_id}.1")
    _args, kwargs, _embed = json.loads(message["body"])
    return kwargs["payload"], kwargs["dispatch"]["meta"]


def store(alias: str, *, payload, metadata, chat_id: str, key: str) -> None:
    """Insert a dead-letter row as the worker would, then roll it back."""
    from django.db import transaction

    from tasks.models import DeadLetter

    with transaction.atomic(using=alias):
        DeadLetter.objects.using(alias).create(
            task_id=str(uuid.uuid4()), task_type="props", lane="t-props", chat_id=chat_id, idempotency_key=key,
            payload=payload, metadata=metadata or {}, reason="poison",
        )
        transaction.set_rollback(True, using=alias)


type_names = st.sampled_from(["plain", "plain", "plain", "chat", "chat", "chat", "off", "unknown"])
odd_type_names = any_text | st.integers() | huge_ints | st.none() | st.binary(max_size=4)


@bounded(ADMISSION_EXAMPLES)
@given(kind=type_names, odd_type=odd_type_names, payload=payloads, metadata=metadatas, priority=priorities,
       timeout=timeouts, chat_id=chat_ids, idempotency_key=idempotency_keys)
@example(kind="plain", odd_type=None, payload={}, metadata=None, priority=None, timeout=10**400, chat_id=None,
         idempotency_key=None)  # found: OverflowError escaped admit
@example(kind="plain", odd_type=None, payload={}, metadata=None, priority=10**5000, timeout=None, chat_id=None,
         idempotency_key=None)  # found: ValueError (int too long to repr) escaped admit
@example(kind="unknown", odd_type=10**5000, payload={}, metadata=None, priority=None, timeout=None, chat_id=None,
         idempotency_key=None)  # found: str() of an unknown huge-int type name raised
@example(kind="unknown", odd_type="x" * 100000, payload={}, metadata=None, priority=None, timeout=None, chat_id=None,
         idempotency_key=None)  # found: a 100 kB type name was echoed whole into the detail
@example(kind="plain", odd_type=None, payload={"a": "\x00"}, metadata=None, priority=None, timeout=None,
         chat_id=None, idempotency_key=None)  # the NUL check (jsonb refuses \u0000): break it and this fails
@example(kind="chat", odd_type=None, payload={"k": 1}, metadata={"m": ["\ud800"]}, priority=9, timeout=1,
         chat_id="\U0001f600" * 128, idempotency_key="\u00e9" * 200)
def test_admit_answers_and_what_it_accepts_can_be_stored(redis_client, prop_types, stores, kind, odd_type, payload,
                                                         metadata, priority, timeout, chat_id, idempotency_key):
    from tasks.dispatch import DispatchResult, admit
    from tasks.reasons import REJECTION_REASONS

    task_type = prop_types.get(kind, odd_type)
    result = admit(task_type, payload, chat_id=chat_id, priority=priority, idempotency_key=idempotency_key,
                   timeout=timeout, metadata=metadata)

    assert isinstance(result, DispatchResult)
    event(f"accepted={result.accepted} reason={result.reason}")  # see --hypothesis-show-statistics
    if not result.accepted:
        assert result.reason in REJECTION_REASONS, result
        assert isinstance(result.detail, str) and 0 < len(result.detail) <= MAX_DETAIL, result
        assert "\x00" not in result.detail and result.detail.encode("utf-8"), result  # loggable, storable
        assert result.task_id is None
        return
    assert kind in ("plain", "chat") and result.task_id
    if result.duplicate:
        return  # the earlier task was checked when it was accepted
    chat = chat_id if kind == "chat" else ""
    stored_payload, stored_meta = published(redis_client, result.task_id, chat)
    assert isinstance(stored_payload, dict)
    for alias in stores:
        store(alias, payload=stored_payload, metadata=stored_meta, chat_id=chat, key=idempotency_key or "")


@pytest.mark.parametrize("depth", [150, 900, 995, 1000, 1100, 5000])
def test_deep_payloads_are_stored_or_refused_with_a_reason(redis_client, prop_types, stores, depth):
    """Nesting near and past every limit (Python's recursion, SQLite's JSON depth, PostgreSQL's stack).

    Not a ``@given`` example: Hypothesis's own pretty-printer recurses on a value this deep.
    """
    from tasks.dispatch import admit

    for kind in ("plain", "chat"):
        chat_id = f"deep-{depth}" if kind == "chat" else None
        result = admit(prop_types[kind], nested(depth), metadata=nested(min(depth, 1000)), chat_id=chat_id)
        if not result.accepted:
            assert result.reason in ("invalid_payload", "invalid_metadata") and result.detail, result
            continue
        stored_payload, stored_meta = published(redis_client, result.task_id, chat_id or "")
        for alias in stores:
            store(alias, payload=stored_payload, metadata=stored_meta, chat_id=chat_id or "", key="")
