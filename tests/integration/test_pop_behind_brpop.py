"""The pop behind the BRPOP (``DISPATCH_POP_WITH_BRPOP``, lanes.transport): a channel of one lane writes its
``pop_more.lua`` call behind its ``BRPOP`` on the lane's doorbell, and Redis runs it as the ``BRPOP``
returns. What it pops is delivered as before, and what a closing channel popped goes back to its lane."""

from __future__ import annotations

import pytest
from django.conf import settings
from kombu import Connection, Consumer, Exchange, Queue

from lanes import keys, transport
from lanes.lua import pop_more
from lanes.lua.loader import script
from tasks.dispatch import admit, dispatch
from tests.support.helpers import define, lane_depth, unique, wait_until

TRANSPORT = "lanes.transport:Transport"


def _consuming(redis_server, lane: str, received: list):
    conn = Connection(redis_server.url, transport=TRANSPORT,
                      transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    channel = conn.channel()
    queue = Queue(lane, Exchange(lane, type="direct"), routing_key=lane, channel=channel)
    consumer = Consumer(channel, [queue], callbacks=[lambda body, message: received.append(message)],
                        accept=["json"])
    consumer.consume()
    return conn, channel, consumer


def _wait_in_poll(conn, channel) -> None:
    """Leave a BRPOP in flight: a drain that times out (kombu keeps the BRPOP and reads it next time)."""
    with pytest.raises(TimeoutError):
        conn.drain_events(timeout=0.2)
    assert channel._in_poll


@pytest.mark.parametrize("behind", [True, False], ids=["pop behind the BRPOP", "pop of its own"])
def test_a_message_that_rings_an_idle_lane_is_popped_in_the_brpops_write(redis_server, rc, monkeypatch, behind):
    """On: the message comes with no pop call of its own (the transport's ``pop_more`` is never called);
    off: the pop is that call. Either way the message is delivered once, named in the in-hand set."""
    monkeypatch.setattr(settings, "DISPATCH_POP_WITH_BRPOP", behind)
    calls = []
    own_pop = transport.pop_more
    monkeypatch.setattr(transport, "pop_more", lambda *a, **k: calls.append(a) or own_pop(*a, **k))
    type_name, lane = unique("behind"), unique("l-behind")
    define(type_name, lane=lane)
    rc.script_load(script(pop_more.NAME).script)  # a worker's first pop loads it (the next test)
    received: list = []
    conn, channel, consumer = _consuming(redis_server, lane, received)
    try:
        _wait_in_poll(conn, channel)
        assert (channel._pop_behind is not None) is behind
        result = dispatch.delay(type_name, {"n": 1})
        wait_until(lambda: _drain(conn) or received, timeout=10, what="the message delivered")
        [message] = received
        assert message.headers["id"] == result.task_id
        assert (calls == []) is behind, calls
        record = message.headers["dispatch_record"]
        assert rc.sismember(keys.process_in_hand(transport.leases.process_id()), record) or \
            rc.sismember(keys.process_held(transport.leases.process_id()), record)
        message.ack()
    finally:
        consumer.cancel()
        conn.release()


def test_a_token_naming_lists_the_pop_behind_did_not_look_at_has_them_taken_at_once(redis_server, rc,
                                                                                     monkeypatch):
    """The pop behind looks at the lists the last token named (a lane that keeps up rings the same ones):
    a message on another list returns the BRPOP with a token naming it, and the channel takes that list
    in a pop of its own at once (those bits, not the poll's look at every list a second later)."""
    calls = []
    own_pop = transport.pop_more
    monkeypatch.setattr(transport, "pop_more", lambda *a, **k: calls.append(a) or own_pop(*a, **k))
    type_name, lane = unique("behind-bits"), unique("l-behind-bits")
    define(type_name, lane=lane)
    rc.script_load(script(pop_more.NAME).script)
    received: list = []
    conn, channel, consumer = _consuming(redis_server, lane, received)
    try:
        _wait_in_poll(conn, channel)
        first = admit(type_name, {"n": 1}, priority=9).task_id
        wait_until(lambda: _drain(conn) or received, timeout=10, what="the first message delivered")
        assert calls == []  # it rode the BRPOP
        _wait_in_poll(conn, channel)
        looked = channel._pop_behind.bits
        assert looked == channel._last_bits[lane] and looked is not None  # the first one's list only
        second = admit(type_name, {"n": 2}, priority=0).task_id
        wait_until(lambda: _drain(conn) or len(received) == 2, timeout=10, what="the second message delivered")
        [(_client, _lane, _lists, _room, bits)] = [call[:5] for call in calls]
        assert bits is not None and bits & looked == 0, (bits, looked)  # the token's other list, not every list
        assert [message.headers["id"] for message in received] == [first, second]
        for message in received:
            message.ack()
    finally:
        consumer.cancel()
        conn.release()


def test_a_pop_behind_that_filled_the_room_it_was_written_with_is_followed_by_one_with_the_room_of_now(
        redis_server, rc):
    """The pop behind is written when the BRPOP is, its room that of then: the smallest while the BRPOP waits
    (acks grow it). A burst that arrives once the room has grown is taken whole in the same delivery, not one
    message a pop (a batched type behind a limit was fed one item a batch so)."""
    from tasks.bulk import dispatch_many

    type_name, lane = unique("behind-room"), unique("l-behind-room")
    define(type_name, lane=lane)
    rc.script_load(script(pop_more.NAME).script)
    received: list = []
    conn, channel, consumer = _consuming(redis_server, lane, received)
    consumer.qos(prefetch_count=4)
    try:
        for n in range(3):  # three in hand: a room of one
            dispatch.delay(type_name, {"n": n})
        wait_until(lambda: _drain(conn) or len(received) == 3, timeout=10, what="three messages in hand")
        _wait_in_poll(conn, channel)
        assert channel._pop_behind is not None and channel._pop_behind.room == 1
        for message in received:
            message.ack()  # the room is four again, the pop behind still takes one
        received.clear()
        dispatch_many(type_name, [{"n": n} for n in range(3, 6)], timeout=30)
        assert _drain(conn)  # one BRPOP's reply read
        assert len(received) == 3, [m.payload for m in received]
        for message in received:
            message.ack()
    finally:
        consumer.cancel()
        conn.release()


def test_what_the_pop_behind_took_as_the_channel_closed_goes_back_to_its_lane(redis_server, rc):
    """The BRPOP in flight when the channel closes: closing reads its reply and the pop's; the messages the
    pop took have no consumer left and go back to their lane's lists (kombu's delivery puts them back)."""
    type_name, lane = unique("behind-close"), unique("l-behind-close")
    define(type_name, lane=lane)
    received: list = []
    conn, channel, _consumer = _consuming(redis_server, lane, received)
    try:
        _wait_in_poll(conn, channel)
        assert channel._pop_behind is not None
        ids = [dispatch.delay(type_name, {"n": i}).task_id for i in range(3)]
        # The first one's doorbell returned the BRPOP and the pop behind it ran in Redis: what it took
        # (the first, or more) is in this process's in-hand set, its reply unread.
        wait_until(lambda: lane_depth(rc, lane) < len(ids), timeout=10, what="the pop behind the BRPOP ran")
        channel.close()
    finally:
        conn.release()
    assert received == []
    wait_until(lambda: lane_depth(rc, lane) == len(ids), timeout=5, what="the popped messages back")
    assert lane_depth(rc, lane) == len(ids)  # back in their lists, for another worker


def test_a_server_without_the_script_refuses_the_pop_behind_once_and_the_usual_pop_loads_it(redis_server, rc,
                                                                                             monkeypatch):
    """After a restart or a ``SCRIPT FLUSH`` the pop behind the BRPOP gets ``NOSCRIPT``: that message is
    popped the usual way (which loads the script), nothing lost, and the next one rides the BRPOP again."""
    calls = []
    own_pop = transport.pop_more
    monkeypatch.setattr(transport, "pop_more", lambda *a, **k: calls.append(a) or own_pop(*a, **k))
    type_name, lane = unique("behind-noscript"), unique("l-behind-noscript")
    define(type_name, lane=lane)
    rc.script_flush()
    received: list = []
    conn, channel, consumer = _consuming(redis_server, lane, received)
    try:
        ids = []
        for n, pops in ((1, 1), (2, 1)):
            _wait_in_poll(conn, channel)
            assert channel._pop_behind is not None
            ids.append(dispatch.delay(type_name, {"n": n}).task_id)
            wait_until(lambda n=n: _drain(conn) or len(received) == n, timeout=10, what=f"message {n} delivered")
            assert len(calls) == pops, calls
        assert [message.headers["id"] for message in received] == ids
        for message in received:
            message.ack()
    finally:
        consumer.cancel()
        conn.release()


def _drain(conn) -> bool:
    try:
        conn.drain_events(timeout=0.2)
    except TimeoutError:
        return False
    return True
