"""``admit_many.packed`` writes what hiredis writes for ``keys_and_args``, byte for byte, whatever the items."""


import hiredis
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes.lua import admit_many
from lanes.lua.loader import _pack

SHA = "0" * 40
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)


@st.composite
def items(draw):
    now = 1_796_000_000.0 + draw(st.floats(0, 1e6))
    shared = {
        "version": draw(st.sampled_from(["1", "17"])), "now": now, "lane": draw(st.sampled_from(["bulk", "lané"])),
        "task_type": draw(st.sampled_from(["t.plain", "t.ünï"])), "accepting": True, "capacity": 1000,
        "chat_queue_size": 50, "idempotency_window_s": 3600, "queued_lease_ms": 30000,
        "replace_idempotency": False,
    }
    out = []
    for _ in range(draw(st.integers(1, 6))):
        key = draw(st.one_of(st.just(""), text.filter(bool)))
        out.append({
            **shared, "task_id": draw(st.uuids()).hex, "message": draw(text) + "\0" + draw(text),
            "kombu_priority": draw(st.integers(0, 9)), "chat": draw(st.one_of(st.just(""), text.filter(bool))),
            "idempotency_key": key, "payload_digest": draw(st.sampled_from(["", "ab" * 16])) if key else "",
            "deadline": now + draw(st.floats(1, 86400)),
            "limits": tuple(draw(st.lists(text.filter(bool), max_size=2))),
            "due": draw(st.one_of(st.just(0.0), st.floats(now, now + 3600))),
        })
    return out


@settings(max_examples=200, deadline=None)
@given(items())
def test_packed_is_what_hiredis_packs_for_keys_and_args(chunk):
    keys, args = admit_many.keys_and_args(chunk)
    expected = hiredis.pack_command(("EVALSHA", SHA, len(keys), *keys, *args))
    call = admit_many.packed(chunk)
    assert (call.numkeys, call.count) == (len(keys), len(keys) + len(args))
    assert _pack(None, [call], SHA) == [expected]
