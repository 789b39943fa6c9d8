"""One checker for the load test and the fault campaign: the same history under each sink's rule."""

from __future__ import annotations

from tools.loadcheck import Applied, Delivery, Op, Sent, check, check_applied, load_histories


def test_a_repeated_key_is_a_redelivery_unless_the_sink_does_not_dedupe():
    ops = [Op("a", 0, "k0", True, "t0")]
    twice = [Delivery("k0", "t0", "a", 0, 200, 1.0, 1.1), Delivery("k0", "t0", "a", 0, 200, 2.0, 2.1)]
    dedupes = check(ops, twice, {})
    assert (dedupes.redeliveries, dedupes.duplicate_effects) == (1, 0) and dedupes.accounted
    strict = check(ops, twice, {}, repeat_is_duplicate=True)
    assert (strict.redeliveries, strict.duplicate_effects, strict.duplicate_keys) == (1, 1, ["k0"])
    # A failed attempt before the application is no duplicate under either rule.
    failed_then_ok = [Delivery("k0", "t0", "a", 0, 500, 1.0, 1.1), twice[1]]
    assert check(ops, failed_then_ok, {}, repeat_is_duplicate=True).duplicate_effects == 0


def test_the_sink_record_becomes_deliveries_in_log_order():
    sent = [Sent("a:1", "a", 1, True, "t1"), Sent("a:2", "a", 2, True, "t2"), Sent("a:3", "a", 3, False)]
    log = [Applied("a", 2, 5000.0, "a:2"), Applied("a", 1, 4000.0, "a:1")]  # Redis order, not clock order
    ops, deliveries, dead = load_histories(sent, log, {"a:1": 1, "a:2": 2}, {"t9"})
    assert [(o.key, o.accepted) for o in ops] == [("a:1", True), ("a:2", True), ("a:3", False)]
    # a:2's second application lost its log line (trimmed: the oldest), so it comes first.
    assert sorted((d.key, d.started) for d in deliveries) == [("a:1", 1.0), ("a:2", -1.0), ("a:2", 0.0)]
    assert dead == {"t9": "dead letter"}


def test_order_examples_are_the_earliest_across_chats():
    sent = [Sent(f"{c}:{q}", c, q, True, f"t-{c}-{q}") for c in "ab" for q in (1, 2)]
    log = [Applied("b", 2, 0, "b:2"), Applied("a", 2, 0, "a:2"), Applied("b", 1, 0, "b:1"), Applied("a", 1, 0, "a:1")]
    v = check_applied(sent, log, {s.key: 1 for s in sent})
    assert v.order_violations == 2
    assert v.order_examples == ["chat b: seq 1 applied after seq 2", "chat a: seq 1 applied after seq 2"]
    assert v.report is not None and v.report.unexpected == v.unknown == 0
