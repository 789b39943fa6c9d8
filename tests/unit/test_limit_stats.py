"""The limits' figures for operators: aggregation, Prometheus families, the terminal table (pure)."""

from __future__ import annotations

from ops import limit_stats, metrics
from ops.limit_stats import InstanceRow, build_rows
from ops.metrics import LaneGauges
from ops.prometheus import limit_families


def _rows(n_keys: int = 1500):
    defs = {"sms": {"scope": "key", "rate": 200, "burst": 50, "max_in_flight": 6},
            "tenant": {"scope": "key", "fair_share": True, "window": 8},
            "bot": {"scope": "global", "rate": 30, "burst": 30}}
    scanned = {"sms": [(f"b{i}", 6, 2) for i in range(limit_stats.SCAN_INSTANCES)],
               "tenant": [("t1", 5, 100), ("t2", 5, 1)], "bot": [("g", 30, 7)]}
    counts = {"sms": n_keys, "tenant": 2, "bot": 1}
    details = {"sms": [InstanceRow(f"k{i}", 6, 2, 1.5, 0.0) for i in range(limit_stats.TOP_KEYS)]}
    rates = {"sms": {"admitted": {"1m": 190.0}, "throttled": {"1m": 12.0}}}
    totals = {"sms": {"admitted": 1e6, "throttled": 5e4}}
    # A fair-share limit's instances hold slots of its window: the limit-wide set is the truth (8, not 10).
    return build_rows(defs, scanned, counts, {"tenant": 8}, details, rates, totals)


def test_rows_sum_the_scanned_instances_and_say_when_they_are_partial():
    bot, sms, tenant = _rows()
    assert (sms.in_flight, sms.waiting, sms.instances, sms.partial, sms.cap) == (6000, 2000, 1500, True, 6)
    assert (tenant.in_flight, tenant.waiting, tenant.partial, tenant.cap) == (8, 101, False, 8)
    assert (bot.in_flight, bot.waiting, bot.partial, bot.cap) == (30, 7, False, None)
    assert sms.admitted_per_s == {"1m": 190.0} and sms.admitted_total == 1e6
    assert len(sms.as_dict()["busiest"]) == limit_stats.TOP_KEYS


def test_prometheus_has_one_series_per_limit_whatever_the_number_of_keys():
    totals = {("lim_admitted", "sms"): 10.0, ("lim_throttled", "sms"): 3.0, ("lim_admitted", "bot"): 4.0}
    for n_keys in (10, 100000):
        fams = limit_families(totals, _rows(n_keys))
        for fam in fams:
            labels = [s.labels for s in fam.samples]
            assert all(set(x) == {"limit"} for x in labels), fam.name
            assert len(labels) == len({x["limit"] for x in labels}) <= 3, fam.name
    by_name = {f.name: {s.labels["limit"]: s.value for s in f.samples} for f in fams}
    assert by_name["dispatch_limit_admitted"] == {"sms": 10.0, "bot": 4.0}
    assert by_name["dispatch_limit_throttled"] == {"sms": 3.0}
    assert by_name["dispatch_limit_in_flight"] == {"bot": 30, "sms": 6000, "tenant": 8}
    assert by_name["dispatch_limit_rate"] == {"bot": 30.0, "sms": 200.0}
    assert by_name["dispatch_limit_max_in_flight"] == {"sms": 6, "tenant": 8}


def test_tasks_waiting_on_a_limit_count_in_a_lanes_waiting_and_what_a_drain_waits_for():
    g = LaneGauges(depth_by_priority={5: 1}, limited=4, in_flight=2)
    assert (g.depth, g.waiting, g.remaining) == (1, 5, 7)


def test_counter_rates_and_totals_per_limit():
    minutes = [{("lim_admitted", "sms"): 30.0, ("lim_throttled", "sms"): 6.0, ("dispatched", "rt", "x"): 9.0},
               {("lim_admitted", "sms"): 60.0}]
    rates = limit_stats.counter_rates(minutes, (1,), 30.0, metrics.rate)
    assert rates == {"sms": {"admitted": {"1m": 1.0}, "throttled": {"1m": 0.067}}}
    assert limit_stats.counter_totals({("lim_admitted", "a"): 2.0, ("completed", "rt"): 1.0}) == {
        "a": {"admitted": 2.0}}


def test_terminal_table_of_limits():
    snap = {"limits": [row.as_dict() for row in _rows()]}
    rows = {r["limit"]: r for r in metrics.limit_table_rows(snap)}
    assert rows["sms"]["keys"] == "1500+" and rows["sms"]["rate/s 1m"] == "190.0" and rows["sms"]["cap"] == 6
    assert rows["sms"]["busiest (running+waiting)"].startswith("k0:6+2 k1:6+2")
    assert rows["bot"]["keys"] == "-" and rows["bot"]["busiest (running+waiting)"] == "-"
    assert rows["tenant"]["scope"] == "key fair"


def test_a_definition_that_is_not_json_is_skipped():
    assert limit_stats.parse_definitions({b"a": b'{"scope": "global"}', b"b": b"{", b"c": b"[1]"}) == {
        "a": {"scope": "global"}}
