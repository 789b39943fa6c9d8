"""The load test's checker: it must find every lost, duplicated and reordered effect."""

from __future__ import annotations

from tools.loadcheck import Applied, Sent, parse_log_line, percentiles, step_passed
from tools.loadcheck import check_applied as check


def sent(chat: str, seq: int, accepted: bool = True, task_id: str | None = None) -> Sent:
    return Sent(f"{chat}:{seq}", chat, seq, accepted, task_id or f"t-{chat}-{seq}")


def applied(chat: str, seq: int, at: float = 0.0) -> Applied:
    return Applied(chat, seq, at, f"{chat}:{seq}")


def test_clean_run_is_all_zeros():
    s = [sent("a", 1), sent("a", 2), sent("b", 1)]
    log = [applied("a", 1), applied("b", 1), applied("a", 2)]
    v = check(s, log, {x.key: 1 for x in s})
    assert (v.accepted, v.applied, v.lost, v.duplicates, v.order_violations, v.unknown) == (3, 3, 0, 0, 0, 0)
    assert v.clean


def test_lost_message_is_reported_unless_dead_lettered():
    s = [sent("a", 1), sent("a", 2), sent("a", 3)]
    log = [applied("a", 1), applied("a", 3)]
    counts = {"a:1": 1, "a:3": 1}
    v = check(s, log, counts)
    assert v.lost == 1 and v.lost_keys == ["a:2"] and not v.clean
    v2 = check(s, log, counts, dead_task_ids={"t-a-2"})
    assert v2.lost == 0 and v2.dead == 1 and v2.clean


def test_rejected_messages_are_not_expected():
    s = [sent("a", 1), sent("a", 2, accepted=False)]
    v = check(s, [applied("a", 1)], {"a:1": 1})
    assert v.accepted == 1 and v.lost == 0


def test_duplicates_count_every_extra_application():
    s = [sent("a", 1), sent("b", 1)]
    log = [applied("a", 1), applied("a", 1), applied("a", 1), applied("b", 1)]
    v = check(s, log, {"a:1": 3, "b:1": 1})
    assert v.duplicates == 2 and v.duplicate_keys == ["a:1"] and v.order_violations == 0


def test_order_violation_within_a_chat_only():
    s = [sent("a", 1), sent("a", 2), sent("a", 3), sent("b", 1)]
    log = [applied("b", 1), applied("a", 2), applied("a", 1), applied("a", 3)]
    v = check(s, log, {x.key: 1 for x in s})
    assert v.order_violations == 1 and "seq 1 applied after seq 2" in v.order_examples[0]


def test_unknown_applications_are_flagged():
    s = [sent("a", 1)]
    v = check(s, [applied("a", 1), applied("z", 9)], {"a:1": 1, "z:9": 1})
    assert v.unknown == 1 and not v.clean


def test_parse_log_line():
    assert parse_log_line(b"chat-1\t3\t1700000000000\tk:1") == Applied("chat-1", 3, 1700000000000.0, "k:1")
    # A fifth field: when the handler's first attempt began (empty on a later attempt).
    assert parse_log_line("c\t1\t2000\tk\t1500.5") == Applied("c", 1, 2000.0, "k", 1500.5)
    assert parse_log_line("c\t1\t2000\tk\t") == Applied("c", 1, 2000.0, "k", None)
    assert parse_log_line("nonsense") is None
    assert parse_log_line("a\tx\t1\tk") is None


def test_percentiles_nearest_rank():
    values = list(range(1, 101))
    assert percentiles(values) == {"p50": 50, "p95": 95, "p99": 99}
    assert percentiles([7.0]) == {"p50": 7.0, "p95": 7.0, "p99": 7.0}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}


def test_step_passes_only_when_clean_and_drained_in_time():
    s = [sent("a", 1)]
    good = check(s, [applied("a", 1)], {"a:1": 1})
    assert step_passed(good, True, 0.5, 10) == (True, "ok")
    assert step_passed(good, True, 12.0, 10)[0] is False
    assert step_passed(good, False, None, 10) == (False, "did not drain")
    bad = check(s, [], {})
    ok, why = step_passed(bad, True, 0.1, 10)
    assert not ok and "1 lost" in why


def test_check_rows_accounts_for_every_message_by_its_row():
    from tools.loadcheck import RowWritten, check_rows

    s = [Sent(f"k{i}", f"k{i}", 0, True, f"t{i}") for i in range(4)] + [Sent("k9", "k9", 0, False, None, "lane_full")]
    rows = [RowWritten("k0", "t0", 1.0), RowWritten("k2", "t2", 2.0), RowWritten("k3", "t3", 3.0)]
    clean = check_rows(s[:1] + s[2:], rows)
    assert (clean.accepted, clean.applied, clean.lost, clean.duplicates, clean.unknown) == (3, 3, 0, 0, 0)
    v = check_rows(s, rows)
    assert v.lost == 1 and v.lost_keys == ["k1"] and not v.clean  # accepted, no row, not dead, not held
    assert check_rows(s, rows, dead_task_ids={"t1"}).clean  # a dead letter is accounted for
    held = check_rows(s, rows, held={"t1"})
    assert held.lost == 0 and held.report.stuck == 1  # still held by the platform: pending, not lost
    # A key written twice, a row written by another task than admission's, a row never accepted.
    bad = check_rows(s[:1] + s[2:], [*rows, RowWritten("k0", "t0", 4.0), RowWritten("k9", "t9", 5.0)])
    assert bad.duplicates == 1 and bad.unknown == 1
    other = check_rows(s[:1], [RowWritten("k0", "t-other", 1.0)])
    assert other.duplicates == 1 and other.duplicate_keys == ["k0"]
