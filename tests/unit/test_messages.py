"""``lanes.messages.build_message`` writes the message of its reference dict, as kombu and the Lua scripts read it.

The text is orjson's (UTF-8, no spaces), not ``json.dumps``'s: the two are held
equal as JSON, at both levels (the message, and the body inside it), and what
reads the raw text finds what it looks for: ``pop_more.lua`` the record's key
after ``"dispatch_record":"``, the admission script one NUL (the delivery tag).
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.serialization import loads as kombu_loads

from lanes import keys
from lanes.messages import Envelope, build_message
from tests.support.message_reference import message_dict

text = st.text(max_size=40).filter(lambda s: not any("\ud800" <= c <= "\udfff" for c in s))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)


def read(message: str) -> dict:
    """The message as a reader sees it: the delivery tag filled in (a raw NUL, or the reference's escaped
    one), the body decoded."""
    decoded = json.loads(message.replace("\0", "tag"))
    if decoded["properties"]["delivery_tag"] == "\0":
        decoded["properties"]["delivery_tag"] = "tag"
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
    built = build_message(*args)
    reference = json.dumps(message_dict(*args), separators=(",", ":"))
    assert read(built) == read(reference)
    assert built.count("\0") == 1 and '"delivery_tag":"\0"' in built
    record = read(built)["headers"]["dispatch_record"]
    if '"' not in record and "\\" not in record and not any(c < " " for c in record):
        assert f'"dispatch_record":"{record}"' in built  # pop_more.lua's match, raw text included
    assert '"dispatch_leased":true' in built
    body_text = json.loads(built.replace("\0", "tag"))["body"]
    args_, kwargs, _embed = kombu_loads(body_text, "application/json", "utf-8")  # as the worker decodes it
    sent = json.loads(json.dumps(envelope.as_dict()))  # what JSON can carry: a meta key 1 arrives as "1"
    assert args_ == [] and kwargs["payload"] == payload and kwargs["dispatch"] == sent
    assert Envelope.from_dict(kwargs["dispatch"]) == Envelope.from_dict(sent)


def test_non_ascii_text_is_written_raw_so_pop_more_finds_the_record():
    envelope = Envelope(type="chat.send", lane="realtime", priority=5, attempt=1, deadline=2e9, dispatched_at=1e9,
                        chat="café-チャット")
    built = build_message("t-1", "http.post", '{"text":"héllo"}', envelope, 10.0)
    assert f'"dispatch_record":"{keys.task_record("t-1", "café-チャット")}"' in built
    assert read(built)["body"][1]["payload"] == {"text": "héllo"}
