"""Throttle and debounce in admission, against the real Redis (no worker: what admission decides and stores).

The property holds admit.lua's decisions to ``tests/support/dedupe_reference.py``
over random sequences of dispatch times and keys, single and bulk; the others
check what a debounce leaves in Redis (chat order, the replaced one REVOKED)
and the doors (``dedupe_key`` refused when bad, namespaced per API caller).
"""

from __future__ import annotations

import itertools
import json
import time
from unittest import mock

import pytest
from celery.exceptions import TaskRevokedError
from django_celery_results.models import TaskResult
from hypothesis import given
from hypothesis import strategies as st

from lanes import keys
from lanes.redis_client import get_redis
from tasks import bulk, config
from tasks.admission import ChunkContext
from tasks.dispatch import dispatch, dispatch_many
from tests.support.api_client import ApiClient, make_token
from tests.support.dedupe_reference import Reference
from tests.support.helpers import define, unique
from tests.support.hypothesis_profile import bounded

WINDOW_S = 1.0


@pytest.fixture(scope="module")
def types():
    lane = unique("t-dd")  # no worker serves it: nothing starts
    out = {mode: define(unique(f"dd-{mode}"), lane=lane, timeout=600, dedupe=mode,
                        dedupe_window=WINDOW_S if mode != "key" else 0).name
           for mode in ("key", "throttle", "debounce")}
    out["chat"] = define(unique("dd-chat"), lane=lane, timeout=600, chat_scoped=True, dedupe="debounce",
                         dedupe_window=WINDOW_S).name
    out["plain-chat"] = define(unique("dd-pchat"), lane=lane, timeout=600, chat_scoped=True).name
    config.forget()
    return out


def _state(rc, task_id: str, chat: str | None = None) -> str | None:
    st_ = rc.hget(keys.task_record(task_id, chat), "st")
    return st_.decode() if st_ else None


def _revoked_reason(task_id: str) -> str:
    row = TaskResult.objects.get(task_id=task_id)
    assert row.status == "REVOKED"
    return row.result


def test_a_debounce_replaces_the_one_waiting_revoked_with_its_reason(rc, types):
    first = dispatch.delay(types["debounce"], {"n": 1}, dedupe_key="typing")
    second = dispatch.delay(types["debounce"], {"n": 2}, dedupe_key="typing")
    assert first.accepted and first.replaced is None and second.replaced == first.task_id
    assert second.as_dict()["replaced"] == first.task_id
    assert _state(rc, second.task_id) == "scheduled"  # sent for later by the window
    assert second.estimated_delay is not None or second.detail  # a countdown's answer
    assert f"replaced by {second.task_id}" in _revoked_reason(first.task_id)
    with pytest.raises(TaskRevokedError, match=f"replaced by {second.task_id}"):
        first.get(timeout=5)
    assert not rc.exists(keys.task_record(first.task_id))  # settled: nothing of it is left waiting
    assert rc.zscore(keys.lane_delayed(first.queue), keys.task_record(first.task_id)) is None


def test_chat_order_a_debounced_message_goes_to_the_chats_tail(rc, types):
    chat = unique("ddc")
    a = dispatch.delay(types["plain-chat"], {"n": "a"}, chat_id=chat)
    d1 = dispatch.delay(types["chat"], {"n": "d1"}, chat_id=chat, dedupe_key="k")
    b = dispatch.delay(types["plain-chat"], {"n": "b"}, chat_id=chat)
    d2 = dispatch.delay(types["chat"], {"n": "d2"}, chat_id=chat, dedupe_key="k")
    assert d2.replaced == d1.task_id
    queue = [x.decode() for x in rc.lrange(keys.chat_queue(chat), 0, -1)]
    assert queue == [a.task_id, b.task_id, d2.task_id]
    assert d2.position == 3
    assert int(rc.zscore(keys.chat_index(), chat)) == 3
    # A debounced head (parked until due) replaced: the chat is handed to the next message.
    chat2 = unique("ddc")
    h1 = dispatch.delay(types["chat"], {"n": 1}, chat_id=chat2, dedupe_key="h")
    c = dispatch.delay(types["plain-chat"], {"n": "c"}, chat_id=chat2)
    h2 = dispatch.delay(types["chat"], {"n": 2}, chat_id=chat2, dedupe_key="h")
    assert h2.replaced == h1.task_id
    assert [x.decode() for x in rc.lrange(keys.chat_queue(chat2), 0, -1)] == [c.task_id, h2.task_id]
    assert _state(rc, c.task_id, chat2) == "queued"
    assert rc.hget(keys.task_record(c.task_id, chat2), "pub") != b"0"  # published: the chat's head now


def test_a_full_chat_refuses_the_newer_one_and_keeps_the_one_waiting(rc, types):
    from tasks.models import TaskType

    name = define(unique("dd-full"), lane=unique("t-dd"), timeout=600, chat_scoped=True, chat_queue_size=1,
                  dedupe="debounce", dedupe_window=WINDOW_S).name
    other = define(unique("dd-fullp"), lane=unique("t-dd"), timeout=600, chat_scoped=True, chat_queue_size=1).name
    config.forget()
    chat, chat2 = unique("ddf"), unique("ddf")
    kept = dispatch.delay(name, {"n": 1}, chat_id=chat, dedupe_key="k")
    dispatch.delay(other, {"n": 0}, chat_id=chat2)  # chat2 full
    refused = dispatch.delay(name, {"n": 2}, chat_id=chat2, dedupe_key="k")
    assert refused.reason == "chat_queue_full"
    assert _state(rc, kept.task_id, chat) == "scheduled"  # not lost to a refused replacement
    same_chat = dispatch.delay(name, {"n": 3}, chat_id=chat, dedupe_key="k")  # takes the slot it frees
    assert same_chat.accepted and same_chat.replaced == kept.task_id
    TaskType.objects.filter(name__in=[name, other]).delete()


def test_a_bad_dedupe_key_is_refused_by_name(types):
    for bad in ("", "k\x00", "k" * 1000, 7):
        result = dispatch.delay(types["throttle"], {}, dedupe_key=bad)
        assert result.reason == "invalid_dedupe_key" and "dedupe_key" in result.detail
    assert dispatch_many(types["debounce"], [({}, {"dedupe_key": ""})])[0].reason == "invalid_dedupe_key"


def test_bulk_answers_as_singles_do(rc, types):
    singles_t = [dispatch.delay(types["throttle"], {"n": n}, dedupe_key="bs") for n in range(4)]
    bulk_t = dispatch_many(types["throttle"], [({"n": n}, {"dedupe_key": "bb"}) for n in range(4)])
    for got in (singles_t, bulk_t):
        assert [(r.accepted, r.duplicate, r.task_id) for r in got] == \
            [(True, False, got[0].task_id)] + [(True, True, got[0].task_id)] * 3
    singles_d = [dispatch.delay(types["debounce"], {"n": n}, dedupe_key="ds") for n in range(4)]
    bulk_d = dispatch_many(types["debounce"], [({"n": n}, {"dedupe_key": "db"}) for n in range(4)])
    for got in (singles_d, bulk_d):
        assert [r.replaced for r in got] == [None] + [r.task_id for r in got[:-1]]
        assert [_state(rc, r.task_id) for r in got] == [None, None, None, "scheduled"]
        for earlier, later in itertools.pairwise(got):
            assert f"replaced by {later.task_id}" in _revoked_reason(earlier.task_id)


def test_the_api_namespaces_dedupe_keys_and_bulk_answers_as_single(rc, types):
    name = types["throttle"]
    one, two = ApiClient(make_token(unique("dd1"), [name])), ApiClient(make_token(unique("dd2"), [name]))
    first = one.post("/dispatch", {"task_type": name, "payload": {"n": 1}, "dedupe_key": "api"}).json()
    again = one.post("/dispatch", {"task_type": name, "payload": {"n": 2}, "dedupe_key": "api"}).json()
    other = two.post("/dispatch", {"task_type": name, "payload": {"n": 3}, "dedupe_key": "api"}).json()
    assert again["duplicate"] and again["task_id"] == first["task_id"]
    assert not other["duplicate"] and other["task_id"] != first["task_id"]  # another caller's key
    items = [{"payload": {"n": n}, "dedupe_key": "api"} for n in range(3)]
    answers = one.post("/dispatch/bulk", {"task_type": name, "items": items}).json()["results"]
    assert [(r["duplicate"], r["task_id"]) for r in answers] == [(True, first["task_id"])] * 3
    name = types["debounce"]
    token = ApiClient(make_token(unique("dd3"), [name]))
    answers = token.post("/dispatch/bulk", {"task_type": name, "items": items}).json()["results"]
    assert [r["replaced"] for r in answers] == [None, answers[0]["task_id"], answers[1]["task_id"]]
    state = token.get(f"/tasks/{answers[0]['task_id']}").json()
    assert state["state"] == "REVOKED" and f"replaced by {answers[1]['task_id']}" in json.dumps(state["result"])
    assert token.get(f"/tasks/{answers[2]['task_id']}").json()["state"] == "SCHEDULED"
    bad = token.post("/dispatch", {"task_type": name, "payload": {}, "dedupe_key": ""})
    assert bad.status_code == 422 and bad.json()["reason"] == "invalid_dedupe_key"


_examples = itertools.count()
EVENTS = st.lists(st.tuples(
    st.sampled_from([0.0, 0.0, 0.25, 0.6, 0.999, 1.0, 1.7]),  # seconds since the previous dispatch
    st.sampled_from(["key", "throttle", "debounce"]),
    st.sampled_from(["a", "b"]),  # the key
    st.sampled_from([1, 2]),  # the payload
    st.booleans(),  # by dedupe_key (else the idempotency key); a key-mode type always by the idempotency key
), min_size=1, max_size=12)


@bounded(25)
@given(events=EVENTS, in_bulk=st.booleans())
def test_property_admission_decides_as_the_reference_model(redis_server, types, events, in_bulk):
    rc = get_redis()
    run = next(_examples)
    model = Reference(window_ms=int(WINDOW_S * 1000))
    now = time.time() + 1000.0 + run * 100  # ahead of Redis' clock: no key expires by its own clock meanwhile
    ids: dict[str, list[str]] = {"debounce": []}
    # Consecutive dispatches at one time, of one type, go in one dispatch_many call when ``in_bulk``.
    groups: list[list[tuple]] = []
    for event in events:
        now += event[0]
        if in_bulk and groups and event[0] == 0 and groups[-1][-1][1] == event[1]:
            groups[-1].append((now, *event[1:]))
        else:
            groups.append([(now, *event[1:])])
    for group in groups:
        at, mode = group[0][0], group[0][1]
        items = []
        for _, _, key, payload, by_dedupe in group:
            key = f"p{run}-{key}"
            options = {"dedupe_key": key} if by_dedupe and mode != "key" else {"idempotency_key": key}
            items.append(({"v": payload}, options))
        context = ChunkContext(at, 0.0, 300_000)
        with mock.patch.object(bulk, "chunk_context", lambda c=context: c):
            got = dispatch_many(types[mode], items)
        for (_, _, key, payload, _), result in zip(group, got, strict=True):
            expected = model.dispatch(mode, key, payload, at, result.task_id or "")
            if expected.kind == "conflict":
                assert result.reason == "idempotency_conflict", (expected, result)
                continue
            assert result.accepted, result
            if expected.kind == "dup":
                assert result.duplicate and result.task_id == expected.task_id, (expected, result)
                model_ids = expected.task_id
            else:
                assert not result.duplicate and result.replaced == (expected.replaced or None), (expected, result)
                model_ids = result.task_id
            if mode == "debounce" and model_ids not in ids["debounce"]:
                ids["debounce"].append(model_ids)
    # Nothing lost: the last of each key waits (scheduled), each one before it is REVOKED by its successor.
    last = set(model.waiting.values())
    for task_id in ids["debounce"]:
        if task_id in last:
            assert _state(rc, task_id) == "scheduled"
        else:
            assert f"replaced by {model.replaced_by[task_id]}" in _revoked_reason(task_id)
