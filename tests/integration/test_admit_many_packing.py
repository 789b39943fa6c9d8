"""``admit.packed`` writes what hiredis writes for the reference ``keys_and_args``, byte for byte, whatever the
items (``tests/support/admit_reference.py``)."""


import hiredis
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes.lua import admit
from lanes.lua.loader import _pack
from tests.support.admit_reference import keys_and_args

SHA = "0" * 40
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)


@st.composite
def chunks(draw):
    now = 1_796_000_000.0 + draw(st.floats(0, 1e6))
    chunk = admit.Chunk(
        version=draw(st.sampled_from(["1", "17"])), now=now, lane=draw(st.sampled_from(["bulk", "lané"])),
        task_type=draw(st.sampled_from(["t.plain", "t.ünï"])), accepting=draw(st.booleans()), capacity=1000,
        chat_queue_size=50, idempotency_window_s=3600, queued_lease_ms=30000, replace_idempotency=draw(st.booleans()),
        dedupe=draw(st.sampled_from(["key", "throttle", "debounce"])), dedupe_window_ms=draw(st.integers(0, 10**8)),
        tombstone_ttl_s=draw(st.integers(0, 10**6)), settle_lease_ms=draw(st.integers(0, 10**6)),
        caller_quota=draw(st.sampled_from([0, 5, 1000])),
    )
    items = []
    for _ in range(draw(st.integers(1, 6))):
        key = draw(st.one_of(st.just(""), text.filter(bool)))
        items.append(admit.Item(
            task_id=draw(st.uuids()).hex, message=draw(text) + "\0" + draw(text),
            kombu_priority=draw(st.integers(0, 9)), chat=draw(st.one_of(st.just(""), text.filter(bool))),
            idempotency_key=key, payload_digest=draw(st.sampled_from(["", "ab" * 16])) if key else "",
            deadline=now + draw(st.floats(1, 86400)), limits=tuple(draw(st.lists(text.filter(bool), max_size=2))),
            due=draw(st.one_of(st.just(0.0), st.floats(now, now + 3600))),
            dedupe_key=draw(st.one_of(st.just(""), text.filter(bool))),
        ))
    return chunk, items, draw(st.booleans())


@settings(max_examples=200, deadline=None)
@given(chunks())
def test_packed_is_what_hiredis_packs_for_keys_and_args(drawn):
    chunk, items, read_estimate = drawn
    keys, args = keys_and_args(chunk, items, read_estimate=read_estimate)
    expected = hiredis.pack_command(("EVALSHA", SHA, len(keys), *keys, *args))
    call = admit.packed(chunk, items, read_estimate=read_estimate)
    assert (call.numkeys, call.count) == (len(keys), len(keys) + len(args))
    assert len(args) == admit.SHARED_ARGS + admit.ITEM_ARGS * len(items)
    assert _pack(None, call, SHA, None) == [expected]
