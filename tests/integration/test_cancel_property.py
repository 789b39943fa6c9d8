"""Property test of the cancel doors (issue 18): any task id, chat id, idempotency key, reason or
requester gets an answer from the closed set, never an exception, and never leaves a half-written
chat behind.

Each example dispatches a few messages to a fresh chat (and one without a chat) on a lane no
worker consumes, then sends a random mix of cancels: by a real task id or any text, by the chat
or any text, by a real idempotency key or any text, with any reason. Afterwards the lane and the
chat hold exactly the messages no cancel answered ``cancelled`` for, every count that admission
reads agrees with them, and every cancelled task has its REVOKED row.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lanes import keys
from tasks import cancel as cancelling
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, unique
from tests.support.hypothesis_profile import bounded

#: Every code point, lone surrogates and NUL included, and the characters that end Redis key names.
any_char = st.characters(exclude_categories=()) | st.sampled_from(["\x00", "\ud800", ":", "{", "}", "|", "\n"])
any_text = st.text(any_char, max_size=30)
anything = any_text | st.none() | st.integers() | st.binary(max_size=5) | st.builds(object)

NAME, LANE = unique("cprop"), unique("lcprop")


def _define_once() -> None:
    if not getattr(_define_once, "done", False):
        define(NAME, lane=LANE, chat_scoped=True, chat_queue_size=64)
        define(NAME + "-free", lane=LANE)
        _define_once.done = True


door = st.one_of(
    st.tuples(st.just("id"), st.integers(0, 5) | anything),
    st.tuples(st.just("chat"), st.just(0) | anything),
    st.tuples(st.just("key"), st.integers(0, 5) | anything),
)


@bounded(60)
@given(n=st.integers(0, 5), calls=st.lists(st.tuples(door, anything, anything), max_size=6))
def test_any_cancel_is_answered_and_leaves_the_chat_whole(n, calls):
    _define_once()
    chat = unique("chat")
    ids = [dispatch.delay(NAME, {"n": i}, chat_id=chat, idempotency_key=f"{chat}-{i}").task_id for i in range(n)]
    free = dispatch.delay(NAME + "-free", {"n": 0}).task_id
    gone: set[str] = set()
    for (kind, target), reason, by in calls:
        if kind == "id":
            task_id = ids[target] if isinstance(target, int) and 0 <= target < n else target
            answers = [dispatch.cancel(task_id, reason, by=by)]
        elif kind == "chat":
            answers = dispatch.cancel_chat(chat if target == 0 else target, reason, by=by)
        else:
            key = f"{chat}-{target}" if isinstance(target, int) else target
            answers = [dispatch.cancel_key(NAME, key, reason, by=by)]
        for a in answers:
            assert a.outcome in cancelling.OUTCOMES, a
            assert isinstance(a.detail, str) and len(a.detail) < 1000
            if a.outcome == "cancelled":
                assert a.task_id in ids and a.task_id not in gone  # a task is cancelled once
                gone.add(a.task_id)
    left = [t for t in ids if t not in gone]
    _assert_whole(chat, left, gone)
    # Clean up through the doors themselves: the lane is then empty (each example starts so).
    assert dispatch.cancel(free).outcome == "cancelled"
    assert sorted(a.task_id for a in dispatch.cancel_chat(chat)) == sorted(left)
    _assert_whole(chat, [], set(ids), free=0)


def _assert_whole(chat: str, left: list[str], gone: set[str], free: int = 1) -> None:
    from django_celery_results.models import TaskResult

    from lanes.redis_client import get_redis

    rc = get_redis()
    assert [x.decode() for x in rc.lrange(keys.chat_queue(chat), 0, -1)] == left
    for task_id in left:
        assert rc.hget(keys.task_record(task_id, chat), "st") == b"queued"
        assert rc.zscore(keys.DEADLINES, keys.task_record(task_id, chat)) is not None
    for task_id in gone:
        assert not rc.exists(keys.task_record(task_id, chat))  # settled
        assert rc.zscore(keys.DEADLINES, keys.task_record(task_id, chat)) is None
    # The head is published (one copy in the lane list), the rest counted as waiting behind it.
    copies = [m for q in keys.lane_queues(LANE) for m in rc.lrange(q, 0, -1)]
    assert lane_depth(rc, LANE) == (1 if left else 0) + free  # + the task without a chat
    for i, task_id in enumerate(left):
        assert sum(task_id.encode() in m for m in copies) == (1 if i == 0 else 0)
    for task_id in gone:
        assert not any(task_id.encode() in m for m in copies)
    assert int(rc.get(keys.lane_chat_waiting(LANE)) or 0) == max(0, len(left) - 1)
    assert (rc.zscore(keys.chat_index(), chat) or 0) == len(left)
    assert not rc.exists(keys.lane_delayed(LANE), keys.lane_limited(LANE))
    rows = dict(TaskResult.objects.filter(task_id__in=list(gone)).values_list("task_id", "status"))
    assert rows == {t: "REVOKED" for t in gone}
