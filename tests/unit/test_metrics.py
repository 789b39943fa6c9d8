"""Pure aggregation behind /metrics, the dashboard and `manage.py lanes` (no Redis, no Django)."""

from __future__ import annotations

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from ops import charts, metrics
from ops.metrics import LaneGauges
from ops.prometheus import families


def _counters(**fields: float) -> metrics.Counters:
    return metrics.parse_counters({k.replace("__", "|"): str(v) for k, v in fields.items()})


def test_parse_and_totals():
    c = metrics.parse_counters({
        b"dispatched|rt|chat.send": b"5", b"dispatched|rt|other": b"2", b"dispatched|bulk|x": b"7",
        b"rejected|rt|chat.send|lane_full": b"3", b"rejected||_unknown|unknown_type": b"1",
        b"retried|rt|chat.send|1": b"4", b"retried|rt|chat.send|2": b"1", b"completed|rt": b"6",
        b"qlat_sum|rt|chat.send": b"1.25",
    })
    assert metrics.total(c, "dispatched", "rt") == 7
    assert metrics.total(c, "dispatched") == 14
    assert metrics.total(c, "rejected") == 4
    assert metrics.by_label(c, "retried", "rt", 3) == {"1": 4, "2": 1}
    assert metrics.total(c, "completed", "rt") == 6
    assert c[("qlat_sum", "rt", "chat.send")] == 1.25


def test_cumulative_buckets_end_at_inf():
    buckets = metrics.cumulative({"0.01": 2, "1.0": 3, "+Inf": 1})
    assert buckets[-1] == ("+Inf", 6)
    as_dict = dict(buckets)
    assert as_dict["0.005"] == 0 and as_dict["0.01"] == 2 and as_dict["0.5"] == 2 and as_dict["1.0"] == 5


def test_rate_includes_the_partial_minute():
    # 90 events in the current minute (30 s in) and the one before: 90 / 90 s.
    assert metrics.rate(90, 1, 30) == 1.0
    assert metrics.rate(0, 5, 0) == 0.0
    assert metrics.rate(600, 15, 0) == 600 / 900


def test_lane_stats_windows_and_percentiles():
    current = _counters(dispatched__a__t=10, completed__a=8, succeeded__a__t=6, dead__a__t__exhausted=2,
                        retried__a__t__1=3, retried__a__t__2=1, **{"qlat__a__t__0.05": 10})
    older = _counters(dispatched__a__t=50, completed__a=50, succeeded__a__t=50, **{"qlat__a__t__1.0": 10})
    ancient = _counters(dispatched__a__t=1000)
    minutes = [current, older] + [{}] * 13 + [ancient]  # index 15 is still in the 15-minute window
    stats = metrics.lane_stats("a", minutes, elapsed_s=30)
    assert stats["dispatched_per_s"]["1m"] == round(60 / 90, 3)
    assert stats["counts_15m"]["dispatched"] == 1060
    assert stats["counts_15m"]["dead"] == 2 and stats["counts_15m"]["succeeded"] == 56
    assert stats["failure_rate_15m"] == round(2 / 58, 4)
    assert stats["retries_by_attempt_15m"] == {"1": 3, "2": 1}
    assert stats["dead_by_reason_15m"] == {"exhausted": 2}
    assert 0.025 < stats["queue_latency_p50_s"] <= 0.05
    assert 0.5 < stats["queue_latency_p95_s"] <= 1.0
    other = metrics.lane_stats("b", minutes, elapsed_s=30)
    assert other["counts_15m"]["dispatched"] == 0 and other["failure_rate_15m"] is None
    assert other["queue_latency_p50_s"] is None


def test_series_from_samples_gaps_and_resets():
    samples = [(100.0, 5, 10.0), (105.0, 4, 20.0), (110.0, 3, 30.0), (200.0, 0, 40.0), (205.0, 0, 0.0)]
    points = metrics.series_from_samples(samples, interval_s=5.0)
    assert [p["throughput"] for p in points] == [None, 2.0, 2.0, None, None]
    assert [p["waiting"] for p in points] == [5, 4, 3, 0, 0]


def test_lane_gauges_sum_what_admission_counts():
    g = LaneGauges(depth_by_priority={9: 2, 5: 3}, scheduled_retries=4, chat_waiting=5, in_flight=1)
    assert g.depth == 5 and g.waiting == 14 and g.remaining == 15


def test_rejections_by_reason_sorted():
    window = _counters(rejected__a__t__lane_full=2, rejected__b__u__lane_closed=5, dispatched__a__t=9)
    rows = metrics.rejections_by_reason(window)
    assert [r["reason"] for r in rows] == ["lane_closed", "lane_full"]
    assert rows[0] == {"lane": "b", "type": "u", "reason": "lane_closed", "count": 5}


class _Static(Collector):
    def __init__(self, fams):
        self.fams = fams

    def collect(self):
        return iter(self.fams)


def test_prometheus_families_follow_the_naming_conventions():
    totals = _counters(dispatched__rt__send=4, started__rt__send=5, succeeded__rt__send=3, retried__rt__send__1=1,
                       dead__rt__send__non_retryable=1, rejected__rt__send__lane_closed=2, completed__rt=4,
                       dead_letter_write_failures__rt__send=1,
                       **{"qlat__rt__send__0.01": 3, "qlat__rt__send__+Inf": 1, "qlat_sum__rt__send": 400.02,
                          "xlat__rt__send__0.5": 4, "xlat_sum__rt__send": 1.6})
    gauges = {"rt": LaneGauges(depth_by_priority={p: (2 if p == 5 else 0) for p in range(10)}, in_flight=1)}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Static(families(totals, gauges, {"rt": {"capacity": 10, "accepting": True}},
                                  {"active": 3, "longest": 7}, {"rt": 1})))
    text = generate_latest(reg).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}

    def value(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("dispatch_tasks_total", lane="rt", type="send", outcome="dispatched") == 4
    assert value("dispatch_tasks_total", lane="rt", type="send", outcome="retried") == 1
    assert value("dispatch_tasks_total", lane="rt", type="send", outcome="rejected") == 2
    assert value("dispatch_rejections_total", lane="rt", type="send", reason="lane_closed") == 2
    assert value("dispatch_dead_letters_total", lane="rt", type="send", reason="non_retryable") == 1
    assert value("dispatch_retries_total", lane="rt", type="send", attempt="1") == 1
    assert value("dispatch_dead_letter_write_failures_total", lane="rt", type="send") == 1
    assert value("dispatch_queue_latency_seconds_bucket", lane="rt", type="send", le="0.01") == 3
    assert value("dispatch_queue_latency_seconds_bucket", lane="rt", type="send", le="300.0") == 3
    assert value("dispatch_queue_latency_seconds_bucket", lane="rt", type="send", le="+Inf") == 4
    assert value("dispatch_queue_latency_seconds_count", lane="rt", type="send") == 4
    assert value("dispatch_queue_latency_seconds_sum", lane="rt", type="send") == 400.02
    assert value("dispatch_execution_latency_seconds_count", lane="rt", type="send") == 4
    assert value("dispatch_lane_depth", lane="rt", priority="5") == 2
    assert value("dispatch_lane_in_flight", lane="rt") == 1
    assert value("dispatch_lane_accepting", lane="rt") == 1
    assert value("dispatch_dead_letters_pending", lane="rt") == 1
    assert value("dispatch_active_chats") == 3 and value("dispatch_chat_backlog_max") == 7


def test_chart_is_self_contained_svg():
    now = 10_000.0
    series = metrics.series_from_samples([(now - 20, 10, 0.0), (now - 15, 8, 10.0), (now - 10, 4, 20.0),
                                          (now - 400, 2, 0.0)])
    svg = charts.lane_chart("rt<x>", series, now)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "rt&lt;x&gt;" in svg and "<x>" not in svg  # the lane name is escaped
    assert 'class="waiting"' in svg and 'class="throughput"' in svg
    assert "http" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    empty = charts.lane_chart("idle", [], now)
    assert "no samples yet" in empty


def test_nice_axis_max():
    assert charts._nice_max(0) == 1.0
    assert charts._nice_max(7) == 10.0
    assert charts._nice_max(37) == 50.0
    assert charts._nice_max(0.3) == 0.5


def test_short_number_formats():
    assert [metrics.format_rate(v) for v in (25.952, 3.6871, 0.0683, 0.0)] == ["26.0", "3.69", "0.068", "0"]
    assert [metrics.format_seconds(v) for v in (None, 0.0123, 1.44, 300)] == ["-", "12ms", "1.4s", "5m"]
