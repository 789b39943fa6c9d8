"""Property test of ``dispatch_many`` (issue 16): any list of items gets one answer per item, in order.

Items are fuzzed as the admission property test fuzzes one dispatch (any JSON-like
payload, hostile values, odd options, unknown option names, malformed pairs), mixed
in one call against the real Redis. Properties: never an exception; one
``DispatchResult`` per item; and each answer is the item's own: an item that one
dispatch would refuse by validation is refused with that same reason at its place,
and every other item is accepted (or a duplicate/conflict of an idempotency key).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.integration.test_properties_admission import (
    any_text,
    chat_ids,
    idempotency_keys,
    metadatas,
    mostly_json,
    payloads,
    priorities,
    timeouts,
)
from tests.support.helpers import define, unique
from tests.support.hypothesis_profile import bounded

BULK_EXAMPLES = 60

_TYPE: dict[str, str] = {}

options = st.fixed_dictionaries({}, optional={
    "chat_id": chat_ids, "priority": priorities, "idempotency_key": idempotency_keys, "timeout": timeouts,
    "metadata": metadatas,
}) | st.dictionaries(any_text | st.integers(), mostly_json, max_size=3) | mostly_json
items = st.lists(
    payloads | st.tuples(payloads, options) | st.lists(payloads, max_size=3) | st.tuples(payloads, st.none()),
    max_size=12,
)


def _type_name() -> str:
    if not _TYPE:
        _TYPE["name"] = unique("bulk-prop")
        define(_TYPE["name"], lane=unique("l-bulk-prop"), capacity=10**9)
    return _TYPE["name"]


@bounded(BULK_EXAMPLES)
@given(batch=items, default_timeout=st.none() | timeouts, default_metadata=st.none() | metadatas)
def test_dispatch_many_answers_every_item_in_order(batch, default_timeout, default_metadata):
    from tasks import config
    from tasks.admission import DispatchResult, chunk_context, prepare
    from tasks.bulk import split_item
    from tasks.dispatch import dispatch_many
    from tasks.reasons import REJECTION_REASONS
    from tasks.validation import Invalid

    name = _type_name()
    results = dispatch_many(name, batch, timeout=default_timeout, metadata=default_metadata)

    assert isinstance(results, list) and len(results) == len(batch)
    snap = config.current()
    defaults = {"timeout": default_timeout, "metadata": default_metadata}
    for item, result in zip(batch, results, strict=True):
        assert isinstance(result, DispatchResult)
        try:  # what one dispatch of this item would say before Redis
            payload, opts = split_item(item, defaults)
            prepare(snap, name, payload, task_id="oracle", context=chunk_context(), **opts)
            expected = None
        except Invalid as exc:
            expected = exc.reason
        if expected is not None:
            assert (result.accepted, result.reason) == (False, expected), (item, result)
            assert result.detail and len(result.detail) <= 500
        else:
            assert result.accepted or result.reason == "idempotency_conflict", (item, result)
        assert result.accepted or result.reason in REJECTION_REASONS
