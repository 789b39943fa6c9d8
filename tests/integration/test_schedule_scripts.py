"""Send later and a retry policy per call, in the scripts alone (no worker): real Redis, real admission."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from lanes import keys
from lanes.lua.audit import audit as lua_audit
from lanes.messages import stored_parts
from tasks import config
from tasks.dispatch import admit, dispatch
from tasks.maintenance import expire_due, promote_due, sweep
from tests.integration.test_limits_scripts import run
from tests.support.helpers import define, lane_depth, sweep_reaching, unique


def record_of(rc, task_id: str, chat: str = "") -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in rc.hgetall(keys.task_record(task_id, chat or None)).items()}


def envelope(rc, task_id: str) -> dict:
    return json.loads(stored_parts(rc.hget(keys.task_record(task_id), "msg"))[4])


@pytest.fixture
def plain(rc):
    lane = unique("sl")
    tt = define(unique("ty"), lane=lane, timeout=600, capacity=3)
    config.forget()
    return tt.name, lane


def test_a_countdown_waits_in_the_delayed_set_and_counts_in_the_depth(rc, plain):
    name, lane = plain
    before = time.time()
    result = admit(name, {"n": 1}, countdown=30)
    assert result.accepted, result
    rec = record_of(rc, result.task_id)
    assert rec["st"] == "scheduled" and rec["pub"] == "0"
    assert before * 1000 + 30_000 <= int(rec["eta"]) <= time.time() * 1000 + 30_000
    assert rc.zscore(keys.lane_delayed(lane), keys.task_record(result.task_id)) == int(rec["eta"])
    # A lease past its due time only: the sweep never republishes it early.
    assert rc.zscore(keys.LEASES, keys.task_record(result.task_id)) > int(rec["eta"])
    assert lane_depth(rc, lane) == 0
    # It holds a place against the lane's capacity (3) as a waiting task does.
    assert admit(name, {"n": 2}).accepted and admit(name, {"n": 3}).accepted
    full = admit(name, {"n": 4}, countdown=5)
    assert (full.accepted, full.reason) == (False, "lane_full")
    assert promote_due([lane]) == 0 and sweep() is not None
    assert record_of(rc, result.task_id)["st"] == "scheduled" and lane_depth(rc, lane) == 2


def test_promotion_publishes_it_once_due_and_not_before(rc, plain):
    name, lane = plain
    result = admit(name, {}, countdown=1.0)
    assert promote_due([lane]) == 0
    assert lane_depth(rc, lane) == 0
    time.sleep(1.1)
    assert promote_due([lane]) == 1
    rec = record_of(rc, result.task_id)
    assert rec["st"] == "queued" and rec["pub"] == "1" and lane_depth(rc, lane) == 1
    assert not rc.zscore(keys.lane_delayed(lane), keys.task_record(result.task_id))


def test_an_eta_in_the_past_or_a_zero_countdown_is_a_plain_dispatch(rc, plain):
    name, lane = plain
    for options in ({"countdown": 0}, {"eta": datetime.now(UTC) - timedelta(seconds=5)}):
        result = admit(name, {}, **options)
        assert record_of(rc, result.task_id)["st"] == "queued", options
    assert lane_depth(rc, lane) == 2


def test_estimated_delay_includes_the_wait(rc, plain):
    name, lane = plain
    rc.zadd(keys.lane_consumers(lane), {"w@test": int(time.time() * 1000) + 60_000})  # a live consumer
    assert admit(name, {}).estimated_delay == 0.0
    result = admit(name, {}, countdown=42)
    assert 41.5 <= result.estimated_delay <= 42.0, result
    eta = datetime.now(UTC) + timedelta(seconds=90)
    assert 89 <= admit(name, {}, eta=eta).estimated_delay <= 90


@pytest.mark.parametrize(("options", "says"), [
    ({"countdown": -1}, "countdown must be seconds in [0,"),
    ({"countdown": "10"}, "countdown must be a number of seconds, not '10'"),
    ({"countdown": True}, "countdown must be a number of seconds"),
    ({"countdown": float("nan")}, "not nan"),
    ({"countdown": float("inf")}, "countdown must be seconds in [0,"),
    ({"countdown": 10**400}, "the longest delay"),
    ({"countdown": 8 * 86400}, "the longest delay"),
    ({"countdown": 5, "eta": datetime.now(UTC)}, "give countdown or eta, not both"),
    ({"eta": datetime(2030, 1, 1)}, "is naive: give it a timezone"),
    ({"eta": "tomorrow"}, "ISO 8601"),
    ({"eta": 1234567890}, "eta must be a timezone-aware datetime"),
    ({"countdown": 700}, "after the task's deadline"),  # the type's timeout is 600 s
    ({"countdown": 30, "timeout": 20}, "pass a longer timeout"),
])
def test_invalid_eta_names_what_is_wrong(rc, plain, options, says):
    name, lane = plain
    result = admit(name, {}, **options)
    assert (result.accepted, result.reason) == (False, "invalid_eta"), result
    assert says in result.detail, result.detail
    assert lane_depth(rc, lane) == 0 and not rc.exists(keys.lane_delayed(lane))


def test_unknown_retry_policy_is_rejected_and_a_known_one_is_carried(rc, plain):
    name, _ = plain
    result = admit(name, {}, retry_policy="no-such-policy")
    assert (result.accepted, result.reason) == (False, "unknown_retry_policy")
    assert "no retry policy named 'no-such-policy'" in result.detail
    assert admit(name, {}, retry_policy=7).reason == "unknown_retry_policy"
    from tasks.models import RetryPolicy

    RetryPolicy.objects.update_or_create(name="one-shot-s", defaults={"max_retries": 0})
    # A policy created after this process cached the config: the rejection path confirms the version.
    ok = admit(name, {}, retry_policy="one-shot-s")
    assert ok.accepted, ok
    assert envelope(rc, ok.task_id)["policy"] == "one-shot-s"
    assert "policy" not in envelope(rc, admit(name, {}).task_id)  # a plain dispatch's message is unchanged


def test_send_by_name_takes_the_same_options(rc, plain):
    name, _ = plain
    eta = (datetime.now(UTC) + timedelta(seconds=60)).isoformat()
    out = dispatch.run(name, {}, eta=eta)  # what an ingress worker runs for send_task("tasks.dispatch", ...)
    assert out["accepted"], out
    assert record_of(rc, out["task_id"])["st"] == "scheduled"
    out = dispatch.run(name, {}, countdown=30, retry_policy="nope")
    assert out["reason"] == "unknown_retry_policy"
    out = dispatch.run(name, {}, eta="2030-01-01T00:00:00")
    assert out["reason"] == "invalid_eta" and "naive" in out["detail"]
    # Celery's own apply_async options, as a Celery user writes them.
    res = dispatch.apply_async(args=[name, {}], countdown=30)
    assert record_of(rc, res.task_id)["st"] == "scheduled"


def test_a_scheduled_chat_message_holds_the_chat_and_parks_when_its_turn_comes(rc):
    lane = unique("sc")
    name = define(unique("ty"), lane=lane, chat_scoped=True, timeout=600).name
    config.forget()
    chat = unique("c")
    first = admit(name, {"n": 0}, chat_id=chat).task_id
    later = admit(name, {"n": 1}, chat_id=chat, countdown=1.0).task_id
    third = admit(name, {"n": 2}, chat_id=chat).task_id
    assert record_of(rc, later, chat)["st"] == "scheduled"
    assert not rc.zscore(keys.lane_delayed(lane), keys.task_record(later, chat))  # behind the head: in the chat
    assert int(rc.get(keys.lane_chat_waiting(lane))) == 2
    run(first, chat)  # the head finishes: the chat's turn reaches the scheduled message before it is due
    assert record_of(rc, later, chat)["st"] == "scheduled"
    assert rc.zscore(keys.lane_delayed(lane), keys.task_record(later, chat))
    # (The lane list still holds the first's copy: no worker popped it here.)
    assert int(rc.get(keys.lane_chat_waiting(lane))) == 1 and lane_depth(rc, lane) == 1
    assert record_of(rc, third, chat)["pub"] == "0"  # still behind it
    # A head that lost its lease (the audit's case) goes back to its delayed set, never published early.
    rc.zrem(keys.LEASES, keys.task_record(later, chat))
    rc.zrem(keys.lane_delayed(lane), keys.task_record(later, chat))
    for _ in range(50):
        lua_audit(now_ms=int(time.time() * 1000), batch=1000, queued_lease_ms=120_000)
        if rc.zscore(keys.LEASES, keys.task_record(later, chat)):
            break
    assert record_of(rc, later, chat)["pub"] == "0"
    assert rc.zscore(keys.lane_delayed(lane), keys.task_record(later, chat))
    time.sleep(1.1)
    assert promote_due([lane]) == 1
    run(later, chat)
    assert record_of(rc, third, chat)["pub"] == "1"
    run(third, chat)
    assert not rc.exists(keys.chat_queue(chat), keys.lane_chat_waiting(lane), keys.lane_delayed(lane))


def test_a_due_scheduled_message_behind_the_head_is_published_at_its_turn(rc):
    lane = unique("sc")
    name = define(unique("ty"), lane=lane, chat_scoped=True, timeout=600).name
    config.forget()
    chat = unique("c")
    first = admit(name, {}, chat_id=chat).task_id
    later = admit(name, {}, chat_id=chat, countdown=0.2).task_id
    time.sleep(0.3)
    run(first, chat)
    rec = record_of(rc, later, chat)
    assert (rec["st"], rec["pub"]) == ("queued", "1")


def test_a_scheduled_task_expires_at_its_deadline(rc):
    lane = unique("se")
    name = define(unique("ty"), lane=lane, chat_scoped=True, timeout=1, attempt_timeout=1).name
    config.forget()
    chat = unique("c")
    head = admit(name, {}, chat_id=chat, countdown=0.8).task_id
    behind = admit(name, {}, chat_id=chat, countdown=0.9).task_id
    assert record_of(rc, head, chat)["st"] == "scheduled"
    time.sleep(1.1)
    expired = expire_due()
    assert expired >= 2, expired
    assert record_of(rc, head, chat).get("st") in (None, "dead")
    assert record_of(rc, behind, chat).get("st") in (None, "dead")
    assert not rc.exists(keys.lane_delayed(lane), keys.lane_chat_waiting(lane), keys.chat_queue(chat))


def test_a_copy_of_a_scheduled_task_never_runs_before_it_is_due(rc, plain):
    """A stray copy in the broker (none exists normally) is answered 'stale' while the task waits."""
    from lanes.lua.start import start as lua_start

    name, _ = plain
    task_id = admit(name, {}, countdown=60).task_id
    reply = lua_start(task_id=task_id, record=keys.task_record(task_id), chat="", attempt=1, owner="t:1:1",
                      now=time.time(), lease_ms=6000, max_deliveries=5, dead_owner="", metric_field="x|y",
                      queue_latency_bucket="", queue_latency_s=0.0, process="t:1", liveness_ms=60_000)
    assert reply.status == "stale", reply
    assert record_of(rc, task_id)["st"] == "scheduled"


def test_the_sweep_makes_a_scheduled_task_that_promotion_missed_due_again(rc, plain):
    """Its lease (due + queued lease) is the backstop when its delayed-set entry is lost:
    the sweep puts it back as due (never earlier than its eta), promotion publishes it."""
    name, lane = plain
    task_id = admit(name, {}, countdown=0.2).task_id
    record = keys.task_record(task_id)
    rc.zrem(keys.lane_delayed(lane), record)  # promotion cannot see it any more
    rc.zadd(keys.LEASES, {record: int(time.time() * 1000) - 1})  # its lease ran out
    time.sleep(0.3)
    assert promote_due([lane]) == 0
    sweep_reaching(rc, record)
    assert record_of(rc, task_id)["st"] == "scheduled"
    assert promote_due([lane]) == 1
    rec = record_of(rc, task_id)
    assert (rec["st"], rec["pub"]) == ("queued", "1") and lane_depth(rc, lane) == 1


def test_the_sweep_never_makes_a_scheduled_task_due_before_its_eta(rc, plain):
    name, lane = plain
    task_id = admit(name, {}, countdown=60).task_id
    record = keys.task_record(task_id)
    rc.zadd(keys.LEASES, {record: int(time.time() * 1000) - 1})  # a lease out of step with its eta
    sweep_reaching(rc, record)
    assert rc.zscore(keys.lane_delayed(lane), record) == int(record_of(rc, task_id)["eta"])
    assert promote_due([lane]) == 0 and record_of(rc, task_id)["pub"] == "0"


def test_a_scheduled_task_of_a_limited_type_passes_the_gate_when_due(rc):
    from tests.integration.test_limits_scripts import limit, limited_type

    lane = unique("sl")
    lim = limit(unique("mif"), scope="global", max_in_flight=1)
    tt = limited_type(unique("ty"), [lim], lane)
    first = admit(tt.name, {}).task_id
    later = admit(tt.name, {}, countdown=0.2).task_id
    assert record_of(rc, later)["st"] == "scheduled"
    assert rc.scard(keys.limit_holding(keys.limit_base(lim.name))) == 1  # waiting for its time holds no slot
    time.sleep(0.3)
    promote_due([lane])
    assert record_of(rc, later)["st"] == "limited"  # due: now it waits on the limit, as a retry would
    run(first)
    assert record_of(rc, later)["st"] == "queued" and record_of(rc, later)["pub"] == "1"


def test_the_http_api_takes_the_same_options(rc, plain):
    from tests.support.api_client import ApiClient, make_token

    name, lane = plain
    client = ApiClient(make_token(unique("svc-sched"), [name]))
    eta = (datetime.now(UTC) + timedelta(seconds=60)).isoformat()
    answer = client.post("/dispatch", {"task_type": name, "payload": {}, "eta": eta})
    assert answer.status_code == 202, answer.content
    assert record_of(rc, answer.json()["task_id"])["st"] == "scheduled"
    rc.zadd(keys.lane_consumers(lane), {"w@test": int(time.time() * 1000) + 60_000})  # a live consumer
    answer = client.post("/dispatch", {"task_type": name, "payload": {}, "countdown": 30})
    assert answer.status_code == 202 and 29 <= answer.json()["estimated_delay"] <= 30, answer.content
    answer = client.post("/dispatch/bulk", {"task_type": name, "items": [{}], "countdown": 30,
                                            "retry_policy": "nope"})
    assert answer.status_code == 403 and answer.json()["reason"] == "forbidden_retry_policy"  # not on the token
    answer = client.post("/dispatch/bulk", {"task_type": name, "items": [{}], "countdown": 30})
    assert record_of(rc, answer.json()["results"][0]["task_id"])["st"] == "scheduled"
    for body, status, reason in (({"countdown": -1}, 422, "invalid_eta"),
                                 ({"eta": "2030-01-01T00:00:00"}, 422, "invalid_eta"),
                                 ({"retry_policy": "nope"}, 403, "forbidden_retry_policy")):
        answer = client.post("/dispatch", {"task_type": name, "payload": {}, **body})
        assert (answer.status_code, answer.json()["reason"]) == (status, reason), answer.content


def test_manage_dispatch_takes_the_same_options(rc, plain):
    from tests.integration.test_cli_exit_codes import manage

    name, _ = plain
    done = manage("dispatch", name, "--countdown", "30")
    assert done.returncode == 0, done.stderr
    assert record_of(rc, json.loads(done.stdout)["task_id"])["st"] == "scheduled"
    done = manage("dispatch", name, "--eta", "2030-01-01T00:00:00")
    assert (done.returncode, json.loads(done.stdout)["reason"]) == (1, "invalid_eta")
    done = manage("dispatch", name, "--retry-policy", "nope")
    assert (done.returncode, json.loads(done.stdout)["reason"]) == (1, "unknown_retry_policy")
