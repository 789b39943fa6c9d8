"""A platform message costs no broker bookkeeping between pop and ack; its lease covers it.

kombu keeps a copy of each delivered message in Redis (``unacked``) until the
ack; for a platform task the record's lease does that job (``lanes.transport``,
``finish.lua``, ``lanes.leases``). These tests hold the two halves of that
bargain: the broker calls are gone, and nothing that kombu's copy used to
rescue is lost without it.
"""

from __future__ import annotations

import base64
import json
import time

import pytest
from kombu import Connection, Exchange, Queue

from lanes import keys
from lanes.messages import listed_message
from lanes.transport import LEASED_HEADER
from tasks.dispatch import dispatch
from tests.support.helpers import define, lane_depth, sweep_reaching, unique, wait_until
from tools import probe

TRANSPORT = "lanes.transport:Transport"


@pytest.fixture
def kombu_queue(redis_server, rc):
    name = unique("leased")
    with Connection(redis_server.url, transport=TRANSPORT) as conn:
        channel = conn.channel()
        queue = Queue(name, Exchange(name, type="direct"), routing_key=name, channel=channel)
        queue.declare()
        producer = conn.Producer(channel=channel)

        def publish(body: dict, leased: bool) -> None:
            headers = {LEASED_HEADER: True} if leased else {}
            producer.publish(body, exchange=queue.exchange, routing_key=name, serializer="json", headers=headers)

        yield conn, channel, queue, publish
    rc.delete(name)


def _unacked(rc) -> tuple[int, int]:
    return rc.hlen("unacked"), rc.zcard("unacked_index")


def test_a_leased_message_is_neither_recorded_nor_acked_in_redis(kombu_queue, rc):
    _conn, _channel, queue, publish = kombu_queue
    before = _unacked(rc)
    publish({"n": 1}, leased=True)
    message = queue.get(no_ack=False)
    assert message.payload == {"n": 1}
    assert _unacked(rc) == before, "a leased message was recorded as unacked"
    probe.install(sql=False)
    trips = probe.snapshot().get("redis_round_trips", 0)
    message.ack()
    assert probe.snapshot().get("redis_round_trips", 0) == trips, "the ack of a leased message called Redis"


def test_any_other_message_keeps_kombus_unacked_copy(kombu_queue, rc):
    _conn, _channel, queue, publish = kombu_queue
    before_hash, _ = _unacked(rc)
    publish({"n": 2}, leased=False)
    message = queue.get(no_ack=False)
    assert _unacked(rc)[0] == before_hash + 1
    message.ack()
    assert _unacked(rc)[0] == before_hash


def test_a_rejected_leased_message_goes_back_to_its_queue(kombu_queue, rc):
    _conn, channel, queue, publish = kombu_queue
    publish({"n": 3}, leased=True)
    message = queue.get(no_ack=False)
    message.reject(requeue=True)
    assert channel.qos.can_consume()
    again = queue.get(no_ack=False)
    assert again is not None and again.payload == {"n": 3} and again.delivery_info["redelivered"]
    again.ack()


def test_a_leased_message_held_when_the_channel_closes_goes_back_to_its_queue(kombu_queue, rc):
    _conn, channel, queue, publish = kombu_queue
    publish({"n": 4}, leased=True)
    held = queue.get(no_ack=False)
    assert held is not None and rc.llen(queue.name) == 0
    channel.close()  # what a warm shutdown does with prefetched messages
    assert rc.llen(queue.name) == 1
    assert json.loads(base64.b64decode(json.loads(rc.lindex(queue.name, 0))["body"])) == {"n": 4}


def _pop_and_run(rc, lane: str, task_id: str):
    """Pop the lane's message and run its task body in this process, as a worker's pool would."""
    from dispatchsite.celery import app
    from tasks.execution import execute

    raw = listed_message(rc, next(rc.rpop(q) for q in keys.lane_queues(lane) if rc.llen(q)))
    _args, kwargs, _embed = json.loads(raw["body"])
    task = app.tasks["http.post"]
    task.push_request(id=task_id, delivery_info={})
    try:
        return execute(task, (), kwargs)
    finally:
        task.pop_request()


def test_a_worker_that_died_after_finishing_but_before_the_result_row_still_gets_its_row(start_worker, sink, rc):
    """Without kombu's copy, the finished record's lease brings the result row back, and the
    handler's effect is not made again."""
    from django_celery_results.models import TaskResult

    name, lane = unique("settle"), unique("l-settle")
    define(name, handler="http.post", lane=lane, options={"url": sink.url}, chat_scoped=True)
    chat = unique("chat")
    result = dispatch.delay(name, {"order": 7}, chat_id=chat)
    record = keys.task_record(result.task_id, chat)

    # A worker pops the message, runs the task to its end (finish.lua) and dies
    # before Celery stores the row: here, the task body run in this process.
    assert _pop_and_run(rc, lane, result.task_id) == {"status": 200}
    assert sink.sink.applied == {result.task_id: 1}
    assert rc.hget(record, "st") == b"done", "the finished record must outlive the unstored row"
    assert not TaskResult.objects.filter(task_id=result.task_id).exists()

    # Its lease runs out: the sweep sends a copy, whose delivery stores the row from the record.
    rc.zadd(keys.LEASES, {record: int((time.time() - 1) * 1000)})
    republished = sweep_reaching(rc, record)
    assert republished >= 1 and lane_depth(rc, lane) == 1
    start_worker(lane, concurrency=1)
    assert result.get(timeout=30) == {"status": 200}
    row = wait_until(lambda: TaskResult.objects.filter(task_id=result.task_id).first(), what="result row")
    assert row.status == "SUCCESS"
    assert sink.sink.applied == {result.task_id: 1} and len(sink.sink.attempts) == 1  # not run again
    # Stored, the record is settled: no key of the chat is left.
    wait_until(lambda: not rc.exists(record) and rc.zscore(keys.LEASES, record) is None, timeout=10,
               what="the record settled")


def test_finished_records_are_settled_once_their_rows_are_stored(start_worker, rc):
    from django_celery_results.models import TaskResult

    name, lane = unique("settled"), unique("l-settled")
    define(name, lane=lane, chat_scoped=True)
    start_worker(lane, concurrency=2)
    chats = [unique(f"c{i}") for i in range(3)]
    results = [dispatch.delay(name, {"i": i}, chat_id=chats[i % 3]) for i in range(30)]
    for r in results:
        r.get(timeout=30)
    assert TaskResult.objects.filter(task_id__in=[r.task_id for r in results], status="SUCCESS").count() == 30
    records = [keys.task_record(r.task_id, chats[i % 3]) for i, r in enumerate(results)]
    wait_until(lambda: not any(rc.exists(record) for record in records), timeout=10, what="records settled")
    assert all(rc.zscore(keys.LEASES, record) is None for record in records)
    assert not rc.hexists("unacked", f"{results[0].task_id}.1")


def test_a_record_is_settled_only_when_the_row_stored_is_its_outcome(monkeypatch):
    """If Celery could not store SUCCESS and stored a FAILURE about that instead, the record must
    stay, so that its copy stores the right row later."""
    from dispatchsite.celery import app
    from lanes import leases

    settled: list[str] = []
    monkeypatch.setattr(leases.current(), "settle", settled.append)
    task = app.tasks["demo.echo"]
    for status in ("FAILURE", "SUCCESS"):
        task.push_request(id="t-settle", dispatch_settle=("rec:t-settle", "SUCCESS"))
        try:
            task.after_return(status, None, "t-settle", (), {}, None)
        finally:
            task.pop_request()
    assert settled == ["rec:t-settle"]


def test_a_claim_no_replica_confirmed_is_not_run_and_its_lease_brings_it_back(start_worker, sink, rc):
    """With ``DISPATCH_REPLICA_ACKS`` = 1, a handler runs only once a replica holds its claim
    (and so its admission): a task a failover could forget is never run, so the caller's resend
    after ``unavailable`` cannot make its effect twice (fault scenario 11b found it made twice).
    The session's Redis has no replica: every WAIT confirms 0."""
    from celery.exceptions import Ignore
    from django.test import override_settings

    name, lane = unique("unconf"), unique("l-unconf")
    define(name, handler="http.post", lane=lane, options={"url": sink.url}, chat_scoped=True)
    chat = unique("chat")
    result = dispatch.delay(name, {"order": 1}, chat_id=chat)
    assert result.accepted, result
    record = keys.task_record(result.task_id, chat)
    with override_settings(DISPATCH_REPLICA_ACKS=1, DISPATCH_REPLICA_ACKS_TIMEOUT_MS=50), pytest.raises(Ignore):
        _pop_and_run(rc, lane, result.task_id)
    assert sink.sink.attempts == [], "a claim no replica confirmed was run"
    assert rc.hget(record, "st") == b"running" and rc.zscore(keys.LEASES, record) is not None

    # Its lease runs out: the sweep sends a copy, which runs once (no replicas asked for here).
    rc.zadd(keys.LEASES, {record: int((time.time() - 1) * 1000)})
    republished = sweep_reaching(rc, record)
    assert republished >= 1
    start_worker(lane, concurrency=1)
    assert result.get(timeout=30) == {"status": 200}
    assert sink.sink.applied == {result.task_id: 1}


def test_the_channels_own_calls_reuse_one_client(kombu_queue, monkeypatch):
    """The pop and the poll's look build no ``Redis`` object per call (kombu's ``conn_or_acquire`` did, once
    a pop: its response callbacks and all, on the worker's event loop); a new pool gets a new client."""
    import redis
    from kombu.transport.redis import Empty

    _conn, channel, _queue, _publish = kombu_queue
    lane = keys.lane_queue(unique("reuse"), 0)
    channel._holds_any([lane])  # the first calls make the channel's client and load the script
    with pytest.raises(Empty):
        channel._get(lane)
    made = []
    original = redis.Redis.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    for _ in range(5):
        assert channel._holds_any([lane]) is False
        with pytest.raises(Empty):
            channel._get(lane)
    assert made == [], f"{len(made)} Redis clients built for 10 calls"
    first = channel._calls()
    channel._disconnect_pools()  # what a reconnect does to the channel's pools
    assert channel._calls() is not first and channel._calls().connection_pool is channel.pool


def _drained(conn) -> None:
    try:
        conn.drain_events(timeout=0.5)
    except TimeoutError:
        pass


@pytest.mark.parametrize("taker", [True, False], ids=["a runner takes it", "kombu's delivery"])
def test_a_popped_platform_message_goes_straight_to_the_lease_books_taker(redis_server, rc, taker):
    """A grouping worker's runner (``LeaseBook.taker_of``) takes a popped platform message from the pop
    itself: a kombu ``Message`` in the channel's QoS (acked, prefetch freed, handed back at close as any
    other), never through kombu's consumer callback; without a taker, or when it declines, kombu's
    delivery as before."""
    from django.conf import settings
    from kombu import Consumer

    from lanes import leases

    type_name, lane = unique("direct"), unique("l-direct")
    define(type_name, lane=lane)
    result = dispatch.delay(type_name, {"n": 1})
    book = leases.current()
    offered, taken, received = [], [], []
    book.taker_of = lambda raw: offered.append(raw) or (taken.append if taker else None)
    try:
        with Connection(redis_server.url, transport=TRANSPORT,
                        transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS) as conn:
            channel = conn.channel()
            queue = Queue(lane, Exchange(lane, type="direct"), routing_key=lane, channel=channel)
            with Consumer(channel, [queue], callbacks=[lambda body, message: received.append(message)],
                          accept=["json"]):
                wait_until(lambda: _drained(conn) or taken or received, timeout=10)
            [raw] = offered
            assert raw["headers"]["id"] == result.task_id
            if taker:
                [message] = taken
                assert received == []
                assert message.headers["id"] == result.task_id
                assert channel.qos._delivered[message.delivery_tag] is message
                message.ack()
                assert message.delivery_tag not in channel.qos._delivered or channel.qos.can_consume()
            else:
                [message] = received
                assert taken == [] and message.headers["id"] == result.task_id
                message.ack()
    finally:
        book.taker_of = None


def test_the_event_loops_tick_hands_no_registered_socket_to_the_poller_again(kombu_queue):
    """Each turn of a worker's event loop runs the transport's tick: kombu's handed every socket to the poller
    again each turn (an ``epoll.register`` answered EEXIST per socket); this one registers a socket once, and
    again only once the hub stopped reading it (a full prefetch window, a reconnect)."""
    from kombu import Consumer
    from kombu.asynchronous import Hub

    conn, channel, queue, _publish = kombu_queue
    hub = Hub()
    poller = hub.poller
    registered = []
    original = poller.register

    def counting(fd, events):
        registered.append(fd)
        return original(fd, events)

    poller.register = counting
    try:
        with Consumer(channel, [queue], callbacks=[lambda body, message: None], accept=["json"]):
            conn.transport.register_with_event_loop(conn.connection, hub)
            for tick in list(hub.on_tick):
                tick()  # the first turn registers the BRPOP socket
            assert registered, "the first turn registers the channel's socket"
            first = len(registered)
            for _ in range(50):
                for tick in list(hub.on_tick):
                    tick()
            assert len(registered) == first, f"{len(registered) - first} registrations in 50 turns"
            [fd] = [fd for fd, (_chan, kind) in conn.transport.cycle._fd_to_chan.items() if kind == "BRPOP"]
            hub.remove_reader(fd)  # as kombu's disconnect hook and a paused BRPOP do
            for tick in list(hub.on_tick):
                tick()
            assert registered[-1] == fd and fd in hub.readers, "a socket the hub stopped reading is handed over again"
    finally:
        hub.close()
