"""The checker can fail: each measure on a small history built to break it."""

from __future__ import annotations

from tools.loadcheck import Delivery, Op, check


def op(chat: str, seq: int, accepted=True, task: str | None = None, reason: str = "") -> Op:
    return Op(chat, seq, f"r:{chat}:{seq}", accepted, task or f"t-{chat}-{seq}", reason)


def ok(chat: str, seq: int, start: float, end: float | None = None, task: str | None = None,
       status: int = 200, key: str | None = None) -> Delivery:
    return Delivery(key or f"r:{chat}:{seq}", task or f"t-{chat}-{seq}", chat, seq, status, start,
                    end if end is not None else start + 0.1)


def test_a_clean_history_is_accounted():
    ops = [op("a", 0), op("a", 1), op("b", 0), op("b", 1, accepted=False, reason="chat_queue_full")]
    dels = [ok("a", 0, 1.0), ok("a", 1, 2.0), ok("b", 0, 1.05)]
    r = check(ops, dels, {})
    assert (r.offered, r.accepted, r.rejected, r.succeeded, r.dead) == (4, 3, 1, 3, 0)
    assert r.accounted and r.rejected_reasons == {"chat_queue_full": 1}


def test_lost_and_stuck():
    ops = [op("a", 0), op("a", 1), op("a", 2)]
    r = check(ops, [ok("a", 0, 1.0)], {}, held={"t-a-2"})
    assert (r.lost, r.stuck) == (1, 1) and not r.accounted
    assert r.examples["lost"] == ["r:a:1"]


def test_dead_letters_account_for_accepted_tasks():
    r = check([op("a", 0), op("a", 1)], [ok("a", 1, 2.0)], {"t-a-0": "poison"})
    assert (r.succeeded, r.dead, r.lost) == (1, 1, 0) and r.dead_reasons == {"poison": 1} and r.accounted


def test_unexpected_rejected_or_never_offered():
    ops = [op("a", 0, accepted=False, reason="unavailable")]
    r = check(ops, [ok("a", 0, 1.0), ok("z", 9, 1.0)], {})
    assert r.unexpected == 2 and not r.accounted
    # An unknown outcome may have been stored: applied or not, neither lost nor unexpected.
    r = check([op("a", 0, accepted=None)], [ok("a", 0, 1.0)], {})
    assert (r.unknown, r.unexpected, r.lost) == (1, 0, 0)


def test_redeliveries_are_counted_but_allowed():
    dels = [ok("a", 0, 1.0, status=500), ok("a", 0, 2.0), ok("a", 0, 3.0)]  # a retry, then a redelivery
    r = check([op("a", 0)], dels, {})
    assert r.redeliveries == 2 and r.duplicate_effects == 0 and r.accounted


def test_duplicate_effects_two_tasks_or_two_keys_and_concurrent_runs():
    r = check([op("a", 0)], [ok("a", 0, 1.0), ok("a", 0, 2.0, task="t-other")], {})
    assert r.duplicate_effects == 1 and not r.accounted  # admitted twice under one key
    r = check([op("a", 0)], [ok("a", 0, 1.0), ok("a", 0, 2.0, key="r:a:0-again")], {})
    assert r.duplicate_effects == 1  # one message applied under two keys
    r = check([op("a", 0)], [ok("a", 0, 1.0, 2.0), ok("a", 0, 1.5, 2.5)], {})
    assert r.concurrent_same_key == 1 and r.duplicate_effects == 0  # one task in flight twice at once


def test_order_violations_reordered_or_overlapping():
    ops = [op("a", 0), op("a", 1), op("a", 2)]
    r = check(ops, [ok("a", 1, 1.0), ok("a", 0, 2.0), ok("a", 2, 3.0)], {})
    assert r.order_violations == 1 and not r.accounted
    r = check(ops, [ok("a", 0, 1.0, 2.0), ok("a", 1, 1.5, 2.5), ok("a", 2, 3.0)], {})
    assert r.order_violations == 1
    # A failed attempt of the head overlapping the next message is a violation too.
    r = check(ops[:2], [ok("a", 0, 1.0, 2.0, status=500), ok("a", 1, 1.5), ok("a", 0, 3.0)], {})
    assert r.order_violations == 2  # overlap, and 1 applied before 0
    # Different chats may overlap freely.
    r = check([op("a", 0), op("b", 0)], [ok("a", 0, 1.0, 2.0), ok("b", 0, 1.5, 2.5)], {})
    assert r.order_violations == 0 and r.accounted
