"""Who made a task, from its id alone (tasks.owners), and a caller's names kept apart (api.tenancy)."""

from __future__ import annotations

import uuid

import pytest

from api.tenancy import Room
from tasks import owners
from tasks.validation import Invalid


def test_owner_is_read_from_the_mark_the_platform_mints():
    plain = str(uuid.uuid4())
    assert owners.owner_of(owners.task_id_prefix(7) + plain) == "token:7"
    assert owners.owner_of(owners.CLI_PREFIX + plain) == "cli"
    assert owners.owner_of(plain) == "python"
    assert owners.owns(7, "tk7-" + plain) and not owners.owns(7, "tk77-" + plain) and not owners.owns(1, plain)
    assert owners.mark_of("tk12-" + plain) == "tk12-" and owners.mark_of(plain) == ""


def test_a_room_namespaces_names_and_caps_timeouts():
    room = Room(token_id=3, shared=False, max_timeout_s=30.0, max_delay_s=10.0)
    out = room.scoped({"chat_id": "c1", "idempotency_key": "k", "limit_key": "t", "priority": 5}, now_s=0.0)
    assert out == {"chat_id": "tk3:c1", "idempotency_key": "tk3:k", "limit_key": "tk3:t", "priority": 5}
    assert room.scoped({"chat_id": 42}, now_s=0.0) == {"chat_id": 42}  # not text: admission refuses it itself
    with pytest.raises(Invalid) as exc:
        room.scoped({"chat_id": "x" * 128}, now_s=0.0)
    assert exc.value.reason == "invalid_chat_id" and "1..124" in exc.value.detail
    for options, reason in (({"timeout": 31}, "invalid_timeout"), ({"countdown": 11}, "invalid_eta"),
                            ({"eta": "1970-01-01T00:00:11+00:00"}, "invalid_eta")):
        with pytest.raises(Invalid) as exc:
            room.scoped(options, now_s=0.0)
        assert exc.value.reason == reason
    shared = Room(token_id=3, shared=True, max_timeout_s=30.0, max_delay_s=10.0)
    assert shared.scoped({"chat_id": "c1"}, now_s=0.0) == {"chat_id": "c1"}


def test_a_detail_shows_the_callers_own_names_and_no_other_callers_task():
    room = Room(token_id=3, shared=False, max_timeout_s=30.0, max_delay_s=10.0)
    assert room.shown("chat 'tk3:c1' already has 2 queued messages", {"chat_id": "c1"}) == \
        "chat 'c1' already has 2 queued messages"
    text = room.shown("idempotency key 'k' was used by task tk9-abc with another payload", {})
    assert "tk9-abc" not in text and "another caller's task" in text
    own = room.shown("idempotency key 'tk3:k' was used by task tk3-abc with another payload", {"idempotency_key": "k"})
    assert own == "idempotency key 'k' was used by task tk3-abc with another payload"


def test_a_lane_share_is_a_whole_number_of_tasks_at_least_one():
    from tasks.owners import lane_quota

    assert lane_quota(50, 10) == 5  # the 6th waiting task is refused
    assert lane_quota(7, 30) == 2  # rounded down
    assert lane_quota(3, 1) == 1 and lane_quota(0, 50) == 1 and lane_quota(10, 0) == 1  # never none
    assert lane_quota(50, 100) == 0 and lane_quota(50, 150) == 0  # the whole lane: the capacity bounds it
