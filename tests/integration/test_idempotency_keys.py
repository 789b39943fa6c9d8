"""Idempotency keys of different task types never collide (issue 12, item 2), against the real Redis."""

from __future__ import annotations

from tests.support.helpers import define, unique


def test_types_whose_names_contain_a_colon_keep_their_keys_apart():
    from tasks.dispatch import dispatch

    base = unique("idc")
    define(base, lane="t-idem")
    define(f"{base}:send", lane="t-idem")
    first = dispatch.delay(base, {}, idempotency_key="send:order-1")
    second = dispatch.delay(f"{base}:send", {}, idempotency_key="order-1")
    assert first.accepted and second.accepted
    assert not second.duplicate and second.task_id != first.task_id
    # Each key still dedups its own type.
    again = dispatch.delay(f"{base}:send", {}, idempotency_key="order-1")
    assert again.duplicate and again.task_id == second.task_id


def test_a_key_stored_in_the_old_format_still_dedups_during_its_window(rc):
    from lanes import keys
    from tasks.dispatch import dispatch, payload_digest
    from tasks.validation import encode_json

    name = unique("idl")
    define(name, lane="t-idem")
    legacy = keys.legacy_idempotency(name, "order-7")
    rc.hset(legacy, mapping={"task": "task-from-before-the-upgrade", "digest": payload_digest(encode_json({"a": 1}))})
    rc.expire(legacy, 600)

    same = dispatch.delay(name, {"a": 1}, idempotency_key="order-7")
    assert same.accepted and same.duplicate and same.task_id == "task-from-before-the-upgrade"
    other = dispatch.delay(name, {"a": 2}, idempotency_key="order-7")
    assert not other.accepted and other.reason == "idempotency_conflict"
    # New keys are written in the new format only.
    fresh = dispatch.delay(name, {"a": 1}, idempotency_key="order-8")
    assert fresh.accepted and not fresh.duplicate
    assert rc.exists(keys.idempotency(name, "order-8")) and not rc.exists(keys.legacy_idempotency(name, "order-8"))
