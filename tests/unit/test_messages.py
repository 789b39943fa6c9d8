"""A task's message: ``lanes.messages.build_message`` stores it compact, ``kombu_message`` writes it out as
the reference dict says kombu and Celery read it.

The text is orjson's (UTF-8, no spaces), not ``json.dumps``'s: the two are held equal as JSON, at both
levels (the message, and the body inside it). The stored form is three lines of JSON (the scripts split
it at its newlines: ``claim_batch.lua`` decodes its first line).
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.serialization import loads as kombu_loads

from lanes import keys
from lanes.messages import Envelope, build_message, kombu_message
from tests.support.message_reference import message_dict

text = st.text(max_size=40).filter(lambda s: not any("\ud800" <= c <= "\udfff" for c in s))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)


def read(message: dict) -> dict:
    """The message as a reader sees it: JSON text decoded (the body too)."""
    decoded = json.loads(json.dumps(message))
    decoded["body"] = json.loads(decoded["body"])
    return decoded


@settings(max_examples=300, deadline=None)
@given(
    task_id=text, handler=text, type_name=text, lane=text, chat=text, key=text, policy=text,
    payload=st.dictionaries(text, json_values, max_size=5),
    meta=st.none() | st.dictionaries(text, json_values, max_size=3) | st.just({1: 2, "big": 2**70}),
    priority=st.integers(0, 9), attempt=st.integers(1, 20),
    deadline=st.floats(0, 4e9) | st.integers(0, 4_000_000_000),
    dispatched=st.floats(0, 4e9), due=st.just(0.0) | st.floats(0, 4e9),
    soft=st.floats(0.001, 1e6) | st.integers(1, 1_000_000),
)
def test_the_message_is_its_reference_as_json(task_id, handler, type_name, lane, chat, key, policy, payload, meta,
                                              priority, attempt, deadline, dispatched, due, soft):
    payload_json = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    envelope = Envelope(type=type_name, lane=lane, priority=priority, attempt=attempt, deadline=deadline,
                        dispatched_at=dispatched, chat=chat, key=key, meta=meta, policy=policy, due=due)
    args = (task_id, handler, payload_json, envelope, soft)
    stored = build_message(*args)
    assert stored.count("\n") == 2 and json.loads(stored.split("\n")[0])[0] == handler
    record = keys.task_record(task_id, chat or None)
    built = kombu_message(stored.encode(), task_id, record, "tag")
    assert read(built) == read(message_dict(*args))
    assert built["headers"]["dispatch_record"] == record and built["headers"]["dispatch_leased"] is True
    args_, kwargs, _embed = kombu_loads(built["body"], "application/json", "utf-8")  # as the worker decodes it
    sent = json.loads(json.dumps(envelope.as_dict()))  # what JSON can carry: a meta key 1 arrives as "1"
    assert args_ == [] and kwargs["payload"] == payload and kwargs["dispatch"] == sent
    assert Envelope.from_dict(kwargs["dispatch"]) == Envelope.from_dict(sent)


def test_the_stored_message_is_a_quarter_of_the_delivered_one():
    envelope = Envelope(type="chat.send", lane="realtime", priority=5, attempt=1, deadline=2e9, dispatched_at=1e9,
                        chat="café-チャット")
    stored = build_message("t-1", "http.post", '{"text":"héllo"}', envelope, 10.0)
    delivered = json.dumps(kombu_message(stored, "t-1", keys.task_record("t-1", "café-チャット"), "t-1.1"))
    assert len(stored.encode()) * 2 < len(delivered.encode())
    assert read(json.loads(delivered))["body"][1]["payload"] == {"text": "héllo"}


def test_a_whole_message_stored_by_an_older_build_is_read_as_it_is():
    older = '{"body":"[]","headers":{"id":"t-1"},"properties":{"delivery_tag":"\0"}}'
    assert kombu_message(older.encode(), "t-1", "r", "t-1.3")["properties"]["delivery_tag"] == "t-1.3"
