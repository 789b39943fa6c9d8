"""Limits on the operator's pages: dashboard, ``/metrics`` and ``manage.py lanes``, from the engine's own state.

The state is written by real dispatches through the gate (a key limit of one
running task per key, with no worker at first: each key's first task holds its
slot, the others wait in Redis), then a real worker drains it all.
"""

from __future__ import annotations

import io
import json
import re

from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from lanes import keys
from tasks.dispatch import admit
from tests.integration.test_limits_workers import make_limit
from tests.integration.test_metrics import scrape, value
from tests.support.helpers import define, unique, wait_until

KEYS = 12
PER_KEY = 3


def _limited_type(lane: str, limits: list) -> str:
    from tasks import config
    from tasks.models import TaskTypeLimit

    name = unique("vis")
    tt = define(name, lane=lane)
    for i, lim in enumerate(limits):
        TaskTypeLimit.objects.create(task_type=tt, limit=lim, position=i)
    config.forget()
    return name


def _lanes_json() -> dict:
    out = io.StringIO()
    call_command("lanes", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_a_key_limit_is_shown_everywhere_with_bounded_labels(start_worker, rc, admin_client):
    lane = unique("lv")
    lim = make_limit(scope="key", max_in_flight=1)
    name = _limited_type(lane, [lim])
    key_values = [unique("supplier") for _ in range(KEYS)]
    results = [admit(name, {"sleep": 0.02, "k": k, "n": n}, limit_key=k) for k in key_values for n in range(PER_KEY)]
    assert all(r.accepted for r in results)

    # /metrics: one series per limit in every limit family, whatever the number of keys.
    m = scrape()
    assert value(m, "dispatch_limit_in_flight", limit=lim.name) == KEYS
    assert value(m, "dispatch_limit_waiting", limit=lim.name) == KEYS * (PER_KEY - 1)
    assert value(m, "dispatch_limit_keys_active", limit=lim.name) == KEYS
    assert value(m, "dispatch_limit_max_in_flight", limit=lim.name) == 1
    assert value(m, "dispatch_limit_admitted_total", limit=lim.name) == KEYS
    assert value(m, "dispatch_limit_throttled_total", limit=lim.name) == KEYS * (PER_KEY - 1)
    assert value(m, "dispatch_lane_limited", lane=lane) == KEYS * (PER_KEY - 1)
    mine = [(n, labels) for (n, labels) in m if n.startswith("dispatch_limit_") and ("limit", lim.name) in labels]
    assert mine and all(labels == (("limit", lim.name),) for _, labels in mine)
    per_family = {n for n, _ in mine}
    assert len(mine) == len(per_family)  # one series per family for this limit, not one per key
    text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {_token()}").content.decode()
    assert not any(k in text for k in key_values)  # no key value is ever a label

    # manage.py lanes --json: the limit, its totals, and its busiest keys (capped at 5).
    snap = _lanes_json()
    row = next(x for x in snap["limits"] if x["name"] == lim.name)
    assert (row["scope"], row["in_flight"], row["waiting"], row["instances"], row["cap"]) == (
        "key", KEYS, KEYS * (PER_KEY - 1), KEYS, 1)
    assert len(row["busiest"]) == 5
    assert all(b["key"] in key_values and (b["in_flight"], b["waiting"]) == (1, PER_KEY - 1) for b in row["busiest"])
    lane_row = next(x for x in snap["lanes"] if x["name"] == lane)
    assert lane_row["limited"] == KEYS * (PER_KEY - 1)
    assert lane_row["waiting"] == lane_row["depth"] + KEYS * (PER_KEY - 1)  # a drain waits for them too

    # manage.py lanes: a second table with the limit.
    out = io.StringIO()
    call_command("lanes", stdout=out)
    table = out.getvalue().split("\nlimits (", 1)[1]
    line = next(x for x in table.splitlines() if x.startswith(lim.name))
    assert re.search(rf"{lim.name}\s+key\s+\S+\s+\S+\s+-\s+{KEYS}\s+1\s+{KEYS * (PER_KEY - 1)}\s", line), line

    # The dashboard: the limit's row with five busiest keys, escaped.
    page = admin_client.get(reverse("dispatch-dashboard")).content.decode()
    part = page.split(f'<tr data-limit="{lim.name}">', 1)[1].split("</tr>", 1)[0]
    assert part.count('class="limit-key"') == 5
    assert f'<span data-field="in_flight">{KEYS}</span> / <span data-field="cap">1</span>' in part
    assert f'<td data-field="waiting">{KEYS * (PER_KEY - 1)}</td>' in part
    data = admin_client.get(reverse("dispatch-dashboard-data")).json()
    assert any(x["name"] == lim.name for x in data["data"]["limits"])

    # A real worker drains it: every slot comes back, the counters add up.
    start_worker(lane, pool="threads", concurrency=4)
    for r in results:
        r.get(timeout=60)
    wait_until(lambda: not rc.exists(keys.limit_instances(lim.name), keys.lane_limited(lane)), timeout=20,
               what="no slot held, nothing waiting")
    m = scrape()
    assert value(m, "dispatch_limit_in_flight", limit=lim.name) == 0
    assert value(m, "dispatch_limit_waiting", limit=lim.name) == 0
    assert value(m, "dispatch_limit_admitted_total", limit=lim.name) == KEYS * PER_KEY
    row = next(x for x in _lanes_json()["limits"] if x["name"] == lim.name)
    assert (row["in_flight"], row["waiting"], row["busiest"]) == (0, 0, [])


def test_a_global_rate_limit_shows_its_bucket_and_rate(rc, admin_client):
    lane = unique("lg")
    lim = make_limit(scope="global", rate=0.5, burst=2)
    name = _limited_type(lane, [lim])
    assert all(admit(name, {"n": n}).accepted for n in range(5))  # two take the burst, three wait
    row = next(x for x in _lanes_json()["limits"] if x["name"] == lim.name)
    assert (row["in_flight"], row["waiting"], row["rate"], row["burst"]) == (2, 3, 0.5, 2)
    assert row["admitted_per_s"]["1m"] > 0 and row["throttled_per_s"]["1m"] > 0
    (only,) = row["busiest"]
    assert only["key"] == "" and only["tokens"] is not None and only["tokens"] < 1
    m = scrape()
    assert value(m, "dispatch_limit_rate", limit=lim.name) == 0.5
    assert ("dispatch_limit_max_in_flight", (("limit", lim.name),)) not in m  # no cap configured, no series
    page = admin_client.get(reverse("dispatch-dashboard")).content.decode()
    part = page.split(f'<tr data-limit="{lim.name}">', 1)[1].split("</tr>", 1)[0]
    assert '<span data-field="rate">0.5</span>' in part and "tokens" in part


def _token() -> str:
    from django.conf import settings

    return settings.DISPATCH_METRICS_TOKEN


def test_the_dashboard_shows_a_limits_current_rate_beside_it(rc, admin_client):
    """A limit that started 12 s ago at 5/s shows 5/s now, not its 1-minute average (about 1/s then)."""
    import time

    from ops import metrics
    from tasks import config

    lim = make_limit(scope="global", rate=5, burst=5)
    _limited_type(unique("lv-now"), [lim])
    config.reload()  # publishes the limit's definition, as a worker's or caller's next call does
    field = f"lim_admitted|{lim.name}"
    rc.delete(keys.LIMIT_SAMPLES)  # only this test's sample in the window
    now = time.time()
    metrics.record_limit_sample(rc, now - 12.0)  # before it ran: its count is 0 (absent)
    rc.hincrbyfloat(keys.METRICS_TOTAL, field, 60)  # 12 s at 5/s
    rc.hincrbyfloat(keys.metrics_minute(int(now // 60)), field, 60)
    rates = metrics.current_limit_rates(rc, now, metrics.read_totals(rc))
    assert 4.9 <= rates[lim.name] <= 5.1, rates
    html = admin_client.get(reverse("dispatch-dashboard-data")).json()["html"]
    row = re.search(rf'<tr data-limit="{re.escape(lim.name)}">(.*?)</tr>', html, re.S)
    assert row, html[-2000:]
    shown = re.search(r'data-field="admitted_now">([^<]*)<', row[1])
    assert shown and 4.5 <= float(shown[1]) <= 5.1, row[1]
    terminal = {row["limit"]: row for row in metrics.limit_table_rows(metrics.snapshot())}  # manage.py lanes
    assert 4.5 <= float(terminal[lim.name]["rate/s now"]) <= 5.1, terminal[lim.name]
