"""``lanes.messages.build_message`` writes, character for character, the JSON of its reference dict.

The text is assembled from its parts for speed; the Lua scripts (pop_more.lua,
claim_batch.lua) and kombu read it as JSON, so any drift from ``json.dumps`` of
``message_dict`` fails here first.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from lanes.messages import Envelope, build_message, message_dict

text = st.text(max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)


def reference(*args) -> str:
    dumped = json.dumps(message_dict(*args), separators=(",", ":"))
    head, _, tail = dumped.rpartition('"\\u0000"')  # the delivery tag: a raw NUL for admit.lua to replace
    return f'{head}"\0"{tail}'


@settings(max_examples=300, deadline=None)
@given(
    task_id=text, handler=text, type_name=text, lane=text, chat=text, key=text, policy=text,
    payload=st.dictionaries(text, json_values, max_size=5),
    meta=st.none() | st.dictionaries(text, json_values, max_size=3),
    priority=st.integers(0, 9), attempt=st.integers(1, 20),
    deadline=st.floats(0, 4e9) | st.integers(0, 4_000_000_000),
    dispatched=st.floats(0, 4e9), due=st.just(0.0) | st.floats(0, 4e9),
    soft=st.floats(0.001, 1e6) | st.integers(1, 1_000_000),
)
def test_the_assembled_text_is_json_dumps_of_the_message(task_id, handler, type_name, lane, chat, key, policy,
                                                         payload, meta, priority, attempt, deadline, dispatched,
                                                         due, soft):
    payload_json = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    envelope = Envelope(type=type_name, lane=lane, priority=priority, attempt=attempt, deadline=deadline,
                        dispatched_at=dispatched, chat=chat, key=key, meta=meta, policy=policy, due=due)
    args = (task_id, handler, payload_json, envelope, soft)
    built = build_message(*args)
    assert built == reference(*args)
    decoded = json.loads(built.replace("\0", "tag"))
    assert decoded["headers"]["id"] == task_id and decoded["properties"]["delivery_tag"] == "tag"
    assert json.loads(decoded["body"])[1]["payload"] == payload
