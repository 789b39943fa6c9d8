"""Every lane has a consumer, or the operator is told (issue 13).

Real redis-server, real worker processes. Waits are polls with a bound
(``wait_until``), never timings.
"""

from __future__ import annotations

import io
import json
import time

from django.core.management import call_command
from django.urls import reverse

from lanes import consumers, keys
from lanes.config_version import bump_config_version
from ops import control
from tasks.dispatch import dispatch
from tests.integration.test_metrics import scrape, value
from tests.support.helpers import define, unique, wait_until

#: Bound on "within seconds": a killed worker's heartbeat expires after the TTL.
FLAG_BOUND_S = consumers.HEARTBEAT_TTL_S + 15


def _holders(rc, lane: str) -> list[str]:
    return consumers.read_holders(rc, [lane], time.time())[lane]


def _lanes_json(lane: str) -> dict:
    out = io.StringIO()
    call_command("lanes", "--json", "--lane", lane, stdout=out)
    return next(row for row in json.loads(out.getvalue())["lanes"] if row["name"] == lane)


def test_catch_all_worker_consumes_a_lane_created_at_run_time(rc, start_worker):
    catch_all = start_worker(unique("ca-own"), env={"DISPATCH_CATCH_ALL": "1"}, concurrency=2)
    # Created while the worker runs, the way the admin does it: rows, then a config version bump.
    lane, name = unique("rt-lane"), unique("rt-echo")
    define(name, lane=lane)
    bump_config_version()

    # Every priority list of the lane is consumed (kombu priority 0 is the bare list, 9 is "lane:9").
    results = [dispatch.delay(name, {"p": p}, priority=p) for p in (0, 5, 9)]
    assert all(r.accepted for r in results)
    wait_until(lambda: all(r.async_result().ready() for r in results), timeout=30,
               what=f"tasks on run-time lane {lane} to finish")
    assert [r.get(timeout=5) for r in results] == [{"p": p} for p in (0, 5, 9)]
    hostname = wait_until(lambda: next((w.hostname for w in consumers.read_workers(rc, time.time())
                                        if w.hostname.startswith(catch_all.name + "@")), None),
                          timeout=FLAG_BOUND_S, what="the catch-all worker's heartbeat")
    wait_until(lambda: _holders(rc, lane) == [hostname], timeout=FLAG_BOUND_S, what="the adopted lane's heartbeat")
    assert _lanes_json(lane)["consuming"] == "consuming"
    assert f"catch_all_adopt lane={lane}" in catch_all.log_text()
    assert dispatch.delay(name, {"again": 1}).detail == ""

    # A dedicated worker for the lane appears: the catch-all worker gives the lane back.
    dedicated = start_worker(lane, concurrency=1)
    wait_until(lambda: [h.split("@")[0] for h in _holders(rc, lane)] == [dedicated.name], timeout=FLAG_BOUND_S,
               what="the catch-all worker to release the lane to the dedicated worker")
    assert dispatch.delay(name, {"after": 1}).get(timeout=30) == {"after": 1}


def test_a_lane_without_a_live_worker_is_flagged_everywhere(rc, start_worker, admin_client):
    lane, name = unique("nc-lane"), unique("nc-echo")
    define(name, lane=lane)
    worker = start_worker(lane, concurrency=1)
    wait_until(lambda: _holders(rc, lane), timeout=FLAG_BOUND_S, what="the worker's heartbeat")
    assert _lanes_json(lane)["consuming"] == "consuming"
    assert value(scrape(), "dispatch_lane_consumers", lane=lane) == 1
    assert dispatch.delay(name, {"i": 0}).get(timeout=30) == {"i": 0}

    # Paused: the worker stopped but will resume, so the lane still has a consumer.
    control.pause(lane, "tester")
    row = wait_until(lambda: (r := _lanes_json(lane))["consuming"] == "paused" and r, timeout=FLAG_BOUND_S)
    assert row["has_consumer"] and len(row["consumers"]) == 1
    control.resume(lane, "tester")

    worker.kill()  # no goodbye: only the heartbeat's expiry tells
    row = wait_until(lambda: (r := _lanes_json(lane))["consuming"] == "no worker" and r, timeout=FLAG_BOUND_S,
                     what="manage.py lanes to flag the lane")
    assert row["has_consumer"] is False and row["consumers"] == []
    assert value(scrape(), "dispatch_lane_consumers", lane=lane) == 0
    result = dispatch.delay(name, {"i": 1})
    assert result.accepted
    assert f"no worker consumes lane '{lane}'" in result.detail

    out = io.StringIO()
    call_command("lanes", "--lane", lane, stdout=out)
    assert "no worker" in out.getvalue()
    data = admin_client.get(reverse("dispatch-dashboard-data")).json()
    assert next(r for r in data["data"]["lanes"] if r["name"] == lane)["consuming"] == "no worker"
    assert "lane-unconsumed" in data["html"]
    changelist = admin_client.get(reverse("admin:lanes_lane_changelist")).content.decode()
    assert "no worker consumes this lane" in changelist
    assert not rc.exists(keys.lane_consumers(lane))  # the expired members leave nothing behind
