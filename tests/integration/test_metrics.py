"""/metrics and `manage.py lanes` against a known mix of tasks run by a real worker."""

from __future__ import annotations

import io
import json

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from lanes.config_version import bump_config_version
from lanes.models import Lane
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, unique, wait_until


def scrape(client: Client | None = None, token: str | None = None) -> dict[tuple, float]:
    client = client or Client()
    token = settings.DISPATCH_METRICS_TOKEN if token is None else token
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(response.content.decode()) for s in fam.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _set_accepting(lane: str, accepting: bool) -> None:
    Lane.objects.filter(name=lane).update(accepting=accepting)
    bump_config_version()


def test_counters_histograms_and_gauges_match_a_known_mix(start_worker, rc):
    lane, parked = unique("m-lane"), unique("m-parked")
    echo, flaky, fatal = unique("m-echo"), unique("m-flaky"), unique("m-fatal")
    waiting, chat = unique("m-wait"), unique("m-chat")
    define(echo, lane=lane)
    define(flaky, handler="demo.flaky", lane=lane, policy={"initial_backoff": 0.05, "jitter": 0})
    define(fatal, handler="demo.flaky", lane=lane)
    define(waiting, lane=parked)
    define(chat, lane=parked, chat_scoped=True, chat_queue_size=2)
    before = scrape()
    start_worker(lane, concurrency=2)

    results = [dispatch.delay(echo, {"sleep": 0.06, "i": i}) for i in range(4)]
    results += [dispatch.delay(flaky, {"fail": "retry", "fail_times": 1, "i": i}) for i in range(2)]
    dead = [dispatch.delay(fatal, {"fail": "fatal", "sleep": 0.06, "i": i}) for i in range(3)]
    assert all(r.accepted for r in results + dead)
    # Rejections: two found before the admission script, two by it, one for an unknown type.
    assert [dispatch.delay(echo, [i]).reason for i in range(2)] == ["invalid_payload"] * 2
    assert dispatch.delay(unique("no-such-type"), {}).reason == "unknown_type"
    _set_accepting(lane, False)
    assert [dispatch.delay(echo, {}).reason for _ in range(2)] == ["lane_closed"] * 2
    _set_accepting(lane, True)
    # The parked lane has no worker: its tasks wait, per priority and behind their chat's head.
    for priority in (9, 5, 5):
        assert dispatch.delay(waiting, {}, priority=priority).accepted
    chat_id = unique("c")
    assert [dispatch.delay(chat, {"n": n}, chat_id=chat_id).reason for n in range(3)] == [
        None, None, "chat_queue_full"]

    for r in results:
        r.get(timeout=30)
    for r in dead:
        with pytest.raises(Exception, match="non_retryable"):
            r.get(timeout=30)
    wait_until(lambda: rc.hget("dispatch:m:total", f"completed|{lane}") == b"9", what="9 completions counted")

    m = scrape()

    def tasks(ttype: str, outcome: str) -> float:
        return value(m, "dispatch_tasks_total", lane=lane, type=ttype, outcome=outcome)

    assert [tasks(echo, o) for o in ("dispatched", "started", "succeeded", "retried", "dead", "rejected")] == [
        4, 4, 4, 0, 0, 4]
    assert [tasks(flaky, o) for o in ("dispatched", "started", "succeeded", "retried", "dead")] == [2, 4, 2, 2, 0]
    assert [tasks(fatal, o) for o in ("dispatched", "started", "succeeded", "retried", "dead")] == [3, 3, 0, 0, 3]
    assert value(m, "dispatch_rejections_total", lane=lane, type=echo, reason="invalid_payload") == 2
    assert value(m, "dispatch_rejections_total", lane=lane, type=echo, reason="lane_closed") == 2
    unknown = {"lane": "", "type": "_unknown", "reason": "unknown_type"}
    assert (value(m, "dispatch_rejections_total", **unknown)
            - value(before, "dispatch_rejections_total", **unknown)) == 1
    assert value(m, "dispatch_rejections_total", lane=parked, type=chat, reason="chat_queue_full") == 1
    assert value(m, "dispatch_dead_letters_total", lane=lane, type=fatal, reason="non_retryable") == 3
    assert value(m, "dispatch_retries_total", lane=lane, type=flaky, attempt="1") == 2
    assert value(m, "dispatch_lane_completed_total", lane=lane) == 9

    # Queue latency: first attempts only; execution latency: finished tasks only.
    for ttype, n in ((echo, 4), (flaky, 2), (fatal, 3)):
        assert value(m, "dispatch_queue_latency_seconds_count", lane=lane, type=ttype) == n
        assert value(m, "dispatch_queue_latency_seconds_bucket", lane=lane, type=ttype, le="+Inf") == n
        assert value(m, "dispatch_execution_latency_seconds_count", lane=lane, type=ttype) == n
    for ttype, n in ((echo, 4), (fatal, 3)):  # both slept 0.06 s: nothing at or under 0.05 s
        assert value(m, "dispatch_execution_latency_seconds_bucket", lane=lane, type=ttype, le="0.05") == 0
        assert value(m, "dispatch_execution_latency_seconds_bucket", lane=lane, type=ttype, le="300.0") == n
        assert value(m, "dispatch_execution_latency_seconds_sum", lane=lane, type=ttype) >= 0.06 * n

    assert value(m, "dispatch_dead_letters_pending", lane=lane) == 3
    assert value(m, "dispatch_lane_in_flight", lane=lane) == 0
    assert value(m, "dispatch_lane_accepting", lane=lane) == 1
    assert value(m, "dispatch_lane_capacity", lane=lane) == 100000
    assert value(m, "dispatch_lane_depth", lane=parked, priority="9") == 1
    assert value(m, "dispatch_lane_depth", lane=parked, priority="5") == 3  # two plain tasks and the chat head
    assert value(m, "dispatch_lane_chat_waiting", lane=parked) == 1
    assert lane_depth(rc, parked) == 4
    assert value(m, "dispatch_active_chats") >= 1 and value(m, "dispatch_chat_backlog_max") >= 2

    # A running task shows as in flight while it runs.
    slow = dispatch.delay(echo, {"sleep": 3})
    wait_until(lambda: value(scrape(), "dispatch_tasks_total", lane=lane, type=echo, outcome="started") == 5,
               what="the slow task started")
    assert value(scrape(), "dispatch_lane_in_flight", lane=lane) == 1
    slow.get(timeout=30)
    assert value(scrape(), "dispatch_lane_in_flight", lane=lane) == 0
    # A worker's counts reach Redis within a second of the task (lanes.counters: kept in process, batched).
    wait_until(lambda: rc.hget("dispatch:m:total", f"completed|{lane}") == b"10", what="10 completions counted")

    # The same numbers in `manage.py lanes --json`.
    out = io.StringIO()
    call_command("lanes", "--json", "--lane", lane, "--lane", parked, stdout=out)
    snap = {row["name"]: row for row in json.loads(out.getvalue())["lanes"]}
    counts = snap[lane]["stats"]["counts_15m"]
    assert (counts["dispatched"], counts["succeeded"], counts["dead"], counts["retried"], counts["rejected"]) == (
        10, 7, 3, 2, 4)
    assert snap[lane]["stats"]["retries_by_attempt_15m"] == {"1": 2}
    assert snap[lane]["stats"]["failure_rate_15m"] == 0.3
    assert snap[lane]["dead_letters"] == 3
    assert (snap[parked]["depth"], snap[parked]["chat_waiting"], snap[parked]["waiting"]) == (4, 1, 5)
    assert snap[parked]["depth_by_priority"]["9"] == 1
    table = io.StringIO()
    call_command("lanes", "--lane", lane, stdout=table)
    assert lane in table.getvalue() and "retries by attempt" in table.getvalue()


def test_metrics_needs_the_token_or_a_staff_login(admin_client):
    anonymous = Client()
    refused = anonymous.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert anonymous.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong-token").status_code == 401
    assert anonymous.get("/metrics", HTTP_AUTHORIZATION=f"Basic {settings.DISPATCH_METRICS_TOKEN}").status_code == 401
    assert b"dispatch_tasks_total" not in refused.content
    assert anonymous.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.DISPATCH_METRICS_TOKEN}").status_code == 200
    assert admin_client.get("/metrics").status_code == 200

    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(unique("plain"), password="pw-plain-123")
    plain = Client()
    plain.force_login(user)
    assert plain.get("/metrics").status_code == 401  # logged in is not enough: staff only
