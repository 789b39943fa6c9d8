"""Deterministic regression tests for defects the fault campaign found (each scenario finds
them only when a fault lands in a narrow window)."""

from __future__ import annotations

import time

from lanes import keys
from lanes.messages import listed_message
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, sweep_reaching, unique


def _queued_lease_expires(rc, record: str) -> None:
    rc.zadd(keys.LEASES, {record: int((time.time() - 1) * 1000)})


def test_sweep_republishes_a_queued_task_only_when_its_copy_left_the_broker(rc):
    """Defect: kombu pops a message (BRPOP) before recording it as unacked; a worker SIGKILLed in
    between loses it, and the head's chat stayed blocked for the whole queued lease (600 s).

    Since issue 17 a popped message is found through its worker's in-hand set (reclaim.lua,
    tests/integration/test_liveness.py); the lease sweep no longer searches lane lists: a queued
    record whose lane list is empty is republished, one whose list is not is parked, once."""
    name, lane = unique("sweepq"), unique("l-sweepq")
    define(name, lane=lane, chat_scoped=True)
    result = dispatch.delay(name, {"n": 1}, chat_id="sweep-chat")
    record = keys.task_record(result.task_id, "sweep-chat")
    queue = keys.lane_queue(lane, 4)
    assert rc.llen(queue) == 1

    # Waiting in the lane past its lease: not copied; parked, so no later sweep looks at it.
    _queued_lease_expires(rc, record)
    sweep_reaching(rc, record)
    assert lane_depth(rc, lane) == 1
    assert rc.zscore(keys.LEASES, record) == float("inf")

    # Popped by a worker that died before naming it anywhere: the list is empty, republished.
    raw = rc.rpop(queue)
    assert listed_message(rc, raw)["properties"]["delivery_tag"] == f"{result.task_id}.1"
    _queued_lease_expires(rc, record)
    sweep_reaching(rc, record)
    assert lane_depth(rc, lane) == 1
    assert listed_message(rc, rc.lindex(queue, 0))["properties"]["delivery_tag"] == f"{result.task_id}.2"


def test_payload_or_metadata_nested_too_deep_is_a_rejection_not_an_exception():
    """Defect: json.dumps raised RecursionError out of dispatch for a deeply nested payload."""
    import pytest

    from tasks.validation import Invalid, check_dispatch

    deep: dict = {}
    cur = deep
    for _ in range(5000):
        cur["x"] = {}
        cur = cur["x"]
    base = dict(type_name="t", enabled=True, chat_scoped=False, max_payload_bytes=65536, default_priority=5,
                default_timeout_s=60.0, payload={"a": 1}, priority=None, timeout=None, chat_id=None,
                idempotency_key=None, metadata=None)
    for field, reason in (("payload", "invalid_payload"), ("metadata", "invalid_metadata")):
        with pytest.raises(Invalid) as err:
            check_dispatch(**{**base, field: deep})
        assert err.value.reason == reason


def _pending_pop_at_shutdown(rc, name: str):
    """A consumer with its BRPOP sent, one message published onto ``name``, then cancelled and closed
    as Celery does at a warm shutdown. Returns what Redis held once the pending reply was read."""
    from django.conf import settings
    from kombu import Connection, Exchange, Queue

    with Connection(settings.REDIS_URL, transport="lanes.transport:Transport") as conn:
        channel = conn.channel()
        queue = Queue(name, Exchange(name, type="direct"), routing_key=name, channel=channel)
        queue.declare()
        consumer = conn.Consumer(queue, callbacks=[lambda body, message: None], channel=channel)
        consumer.consume()
        conn.transport.cycle.on_poll_start()  # sends the worker's BRPOP
        conn.Producer(channel=conn.channel()).publish({"n": 1}, exchange=queue.exchange, routing_key=name,
                                                      serializer="json")
        yield conn
        consumer.cancel()  # Celery cancels its consumers, then closes the connection


def test_a_message_popped_as_the_worker_shuts_down_goes_back_to_its_queue(rc):
    """Defect (scenario 2, intermittent): a warm shutdown closes the broker connection while a BRPOP
    is pending. kombu takes each channel out of the transport's list, then closes it; closing reads
    the pending reply, and a message in it, having no consumer left, is handed to "the first
    channel" of an empty list: dropped without a word. Its chat waited for the recovery sweep (the
    queued lease, 60 s in production). Since the lane doorbells only a queue that is not a lane
    (``ingress``: its messages have no record) is popped by BRPOP; this one is such a queue."""
    name = f"nonlane@{unique('popped')}"
    from lanes import keys
    assert not keys.is_lane_queue(name)
    for _ in _pending_pop_at_shutdown(rc, name):
        wait = time.time() + 5
        while rc.llen(name) and time.time() < wait:  # Redis hands it to the pending BRPOP
            time.sleep(0.01)
        assert rc.llen(name) == 0
    assert rc.llen(name) + sum(rc.llen(f"{name}:{p}") for p in range(1, 10)) == 1, "the popped message was dropped"


def test_a_doorbell_token_read_as_the_worker_shuts_down_is_rung_again(rc):
    """The same shutdown on a lane: the pending BRPOP names the lane's doorbell, so Redis hands it the
    token, never the message. The message stays in its list, or, taken by the pop written behind the
    BRPOP (``DISPATCH_POP_WITH_BRPOP``), is put back in it; the token is rung again for the next
    worker (lanes/transport.py), so no worker waits a second for the poll."""
    from django.conf import settings

    from lanes import keys
    from lanes.lua import pop_more
    from lanes.lua.loader import script

    rc.script_load(script(pop_more.NAME).script)  # as a worker's earlier pops have (else NOSCRIPT: no pop behind)
    name = unique("l-popped")
    bell = keys.lane_doorbell(name)
    for _ in _pending_pop_at_shutdown(rc, name):
        wait = time.time() + 5
        while rc.llen(bell) and time.time() < wait:  # Redis hands the token to the pending BRPOP
            time.sleep(0.01)
        # The pop behind the BRPOP ran as it returned: the message left its list, named in this
        # process's in-hand set (lanes/lua/pop_more.lua), until the channel reads the reply.
        assert rc.llen(bell) == 0 and rc.llen(name) == (0 if settings.DISPATCH_POP_WITH_BRPOP else 1)
    assert rc.llen(name) == 1, "the message left its list"
    assert rc.llen(bell) == 1, "the token read at shutdown was not rung again"
