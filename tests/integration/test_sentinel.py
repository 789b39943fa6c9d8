"""Redis Sentinel: the platform's client, its Lua calls, the broker transport and
``DISPATCH_REPLICA_ACKS`` against a real primary, replica and three Sentinels."""

from __future__ import annotations

import secrets

import pytest
from django.test import override_settings

from lanes import keys
from lanes.redis_client import get_redis, reset_redis
from tests.support.helpers import define, unique
from tests.support.sentinel import SentinelTopology


@pytest.fixture
def topology(tmp_root):
    topo = SentinelTopology(tmp_root / unique("sentinel"), secrets.token_urlsafe(12)).start()
    yield topo
    topo.stop(kill=True)


@pytest.fixture
def on_sentinel(topology):
    """This process's platform client (and config cache) pointed at the Sentinels."""
    from tasks import config

    with override_settings(REDIS_URL=topology.url, DISPATCH_SENTINEL_MASTER=topology.master_name):
        reset_redis()
        config.reload()
        yield topology
    reset_redis()
    config.reload()


def _admit(type_name: str, chat: str, key: str):
    from tasks.dispatch import admit

    return admit(type_name, {"n": 1}, chat_id=chat, idempotency_key=key, timeout=300)


def test_dispatch_follows_the_master_through_a_failover(on_sentinel):
    topo = on_sentinel
    name = unique("sn-type")
    define(name, lane=unique("sn-lane"), chat_scoped=True)
    first = _admit(name, "c1", unique("k"))
    assert first.accepted, first
    old = topo.master_address()
    assert get_redis().connection_pool.get_master_address() == old
    topo.kill_master()
    new = topo.wait_failover(old)
    answers = [_admit(name, "c1", unique("k")) for _ in range(3)]
    # A call on a connection to the dead master may answer unavailable; the next reaches the new master,
    # which never saw the scripts (EVALSHA -> NOSCRIPT -> EVAL).
    assert answers[-1].accepted, answers
    assert get_redis().connection_pool.get_master_address() == new
    record = keys.task_record(answers[-1].task_id, "c1")
    assert topo.client().exists(record)


def test_replica_acks_wait_for_the_replica_or_answer_outcome_unknown(on_sentinel):
    topo = on_sentinel
    name = unique("sn-acks")
    define(name, lane=unique("sn-lane"), chat_scoped=True)
    with override_settings(DISPATCH_REPLICA_ACKS=1, DISPATCH_REPLICA_ACKS_TIMEOUT_MS=300):
        held = _admit(name, "c1", unique("k"))
        assert held.accepted, held
        replica = topo.node_client(topo.nodes[1])
        assert replica.exists(keys.task_record(held.task_id, "c1"))  # WAIT returned: the replica has it
        topo.nodes[1].kill()
        key = unique("k")
        lost = _admit(name, "c2", key)
    assert not lost.accepted and lost.reason == "unavailable", lost
    assert lost.detail.startswith("outcome unknown") and "replicas" in lost.detail, lost.detail
    # Without the replica requirement the same key finds the stored task (one task, never two).
    again = _admit(name, "c2", key)
    assert again.accepted and again.duplicate, again


def test_broker_transport_publishes_and_consumes_on_the_new_master(topology):
    from kombu import Connection, Exchange, Queue

    options = {"master_name": topology.master_name, "socket_timeout": 2, "socket_connect_timeout": 2}
    name = unique("sn-q")
    received = []
    for round_ in ("before", "after"):
        if round_ == "after":
            old = topology.kill_master()
            topology.wait_failover(old)
        with Connection(topology.url, transport="lanes.transport:SentinelTransport",
                        transport_options=options) as conn:
            channel = conn.channel()
            queue = Queue(name, Exchange(name, type="direct"), routing_key=name, channel=channel)
            queue.declare()
            conn.Producer(channel=channel).publish({"round": round_}, exchange=queue.exchange, routing_key=name,
                                                   serializer="json")
            message = queue.get(no_ack=False)
            assert message is not None
            received.append(message.payload["round"])
            message.ack()
            assert conn.transport.driver_name == "redis" and channel.master_name == topology.master_name
    assert received == ["before", "after"]
