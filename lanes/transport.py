"""kombu's Redis transport, hardened: a message that is not even JSON cannot stop a worker,
an ack lost to an unreachable Redis cannot either, and a message popped as a
worker shuts down goes back to its queue; and lean: between its pop and its ack
a platform task's message costs at most a share of one batched Redis call
(naming it in the worker's in-hand set, where a dead worker's popped messages
are found: docs/liveness.md), and several messages come in one pop. A lane's
messages are popped only by a script that names them in that set in the same
call: the worker blocks on the lane's doorbell, never on its lists.

Stock kombu keeps a copy of every delivered message in Redis (its unacked hash,
one pipelined call on receipt, another on ack) so that it can hand it back
after the visibility timeout if its worker dies. A platform task does not need
it: its record already carries the message under a lease (``lanes/lua``):
queued until the claim, renewed while it runs, and, once finished, until its
result row is stored; the recovery sweep republishes it when a lease runs out,
and the claim lets exactly one copy run. So a message marked as leased
(``LEASED_HEADER``) is held in worker memory, its record named in the
process's in-hand set by the pop itself (``POP_MORE``: one SADD for every
message it takes, instead of kombu's HSET and ZADD per message): the ack is
free (the entry is removed at the next liveness beat), and a message handed
back (rejected, or held at shutdown) is pushed back from memory, ringing its
lane's doorbell. Any other message (Celery's own tasks) keeps kombu's handling.

A lane list does not hold a platform task's message either: its item names the
record (``<record>#<publish>``), ``POP_MORE`` reads the record's compact stored
message in the same call, and the kombu message is written out here
(``lanes.messages.kombu_message``), as ``Channel._put`` would have written it.

Stock kombu decodes each popped message inside the consumer's event loop; bytes
that are not JSON (pushed onto a lane by mistake or malice) raise there and the
worker exits with "Unrecoverable error", and JSON without the fields kombu needs
reads as a lost connection. Here such a message is logged, reported through
``lanes.signals.message_unreadable`` (the tasks app keeps it as a ``malformed``
dead letter), and dropped; the worker goes on.

Stock kombu pops one message per ``BRPOP`` on the queue's lists, and names it
in Redis only after the reply: a worker killed in between left it in no list
and no set. Here, for a lane queue (``lanes.keys.is_lane_queue``), the
``BRPOP`` names the lane's doorbell (``lanes.keys.lane_doorbell``), a list
holding at most one token that every push onto the lane's lists rings (the
platform's scripts, and ``_put`` / ``_do_restore_message`` here); a queue that
is not a lane keeps kombu's ``BRPOP`` on its lists, in the same command. A
token runs ``POP_MORE`` (``lanes/lua/pop_more.lua``): as many messages as the
prefetch window has room for (at least one), from the lists the token names in
``BRPOP``'s order, each named in the in-hand set in the same script and
delivered as if popped alone; one that fills its room rings again so another
idle worker wakes. A ``BRPOP`` that times out (kombu's ``brpop_timeout``, 1 s)
looks at every list of the channel's lanes anyway, and so does a token when the
lane's lists were not all looked at within that time: a token lost with a
killed worker, or a message pushed without a ring (a bare Celery client),
waits about a second at most.

The pop behind the ``BRPOP`` (``DISPATCH_POP_WITH_BRPOP``): a channel of one
lane (a platform worker's) writes its ``POP_MORE`` call right behind the
``BRPOP``, in one write; Redis runs it as the ``BRPOP`` returns, so an idle
lane's first message waits for no round trip of its own after the token. Its
terms (room, claims, ``now_ms``) are those of the send: the channel delivers
nothing while the ``BRPOP`` is in flight, so its room can only have grown, and
its leases count from up to a ``BRPOP`` timeout earlier. The token is not
known yet: the pop looks at the lists the last token named (every list when
they were not all looked at for a ``BRPOP`` timeout), and what a token names
beyond them is taken at once, its bits only. Its room is the one of the send,
the smallest while the ``BRPOP`` waits: a pop behind that filled it is followed
at once by a pop with the room of now. A server without the
script (a restart, a ``SCRIPT FLUSH``) refuses it with ``NOSCRIPT`` and that
pop is made the usual way, which loads it; what a closing channel, or a lane
cancelled since the send, popped is handed back to its lane.

With ``appendfsync always`` (``make run``'s
Redis) a pop is a write whose reply waits for Redis's next fsync, so taking
several messages a pop is what lets a worker take more than one per fsync.

The claim at the pop: a worker whose group runner has idle run threads
(``tasks.grouping``) passes ``POP_MORE`` what it may claim
(``LeaseBook.pop_claims``); the script claims those messages as ``start.lua``
would (named in the held set instead of the in-hand set), and the channel
puts each claim in the book (``claimed_at_pop``: its lease renewed from then
on) before delivering the message as before, so the message itself (what
Flower and ``celery inspect`` see) is unchanged; the runner takes the claim
from the book. A claim nothing takes (a message Celery's own path handled) is
let go at its ack, and its lease brings the task back.

Stock kombu frees a message's prefetch slot only after its ack reached Redis.
An ack that timed out (Redis frozen, fault scenario 4) kept its slot forever:
once a worker had lost as many acks as its prefetch count, it stopped
consuming for good, with nothing in its log but "Couldn't ack". Here the slot
is freed either way; the message stays in Redis's unacked hash, from where it
returns to its queue after the visibility timeout, and its redelivery is
refused or re-stored by the claim (``start.lua``), never run twice.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from functools import cached_property
from typing import Any, NamedTuple

import redis
from django.conf import settings
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from lanes import keys, leases
from lanes.lua.pop_more import PopCall, Popped, pop_call, pop_more, popped_of
from lanes.lua.ring import ring
from lanes.messages import LEASED_HEADER, RECORD_HEADER, WRITTEN_ATTRIBUTE, Written, written_message
from lanes.signals import message_unreadable

logger = logging.getLogger(__name__)



#: Most messages one ``POP_MORE`` call takes (the prefetch window bounds it first).
POP_MORE_MAX = 64


def record_of(message) -> str | None:
    """The task record a leased message stands for (older messages: from its body)."""
    record = message.headers.get(RECORD_HEADER)
    if isinstance(record, str) and record:
        return record
    try:
        task_id = message.headers["id"]
        _args, kwargs, _embed = json.loads(message.body)
        chat = (kwargs.get("dispatch") or {}).get("chat") or None
        return keys.task_record(task_id, chat) if isinstance(task_id, str) else None
    except Exception:  # noqa: BLE001 - not a platform message after all: nothing to name
        return None


class QoS(kombu_redis.QoS):
    def _leased(self, delivery_tag) -> bool:
        message = self._delivered.get(delivery_tag)  # type: ignore[attr-defined]  # kombu sets it per instance
        return message is not None and message.headers.get(LEASED_HEADER) is True

    def append(self, message, delivery_tag):
        if message.headers.get(LEASED_HEADER) is True:
            virtual.QoS.append(self, message, delivery_tag)
            record = record_of(message)
            if record:
                self.channel.lease_book.take_in_hand(record, written=record == self.channel._popped_in_hand)
            return
        super().append(message, delivery_tag)

    def _out_of_hand(self, delivery_tag) -> None:
        message = self._delivered.get(delivery_tag)  # type: ignore[attr-defined]  # kombu sets it per instance
        record = record_of(message) if message is not None else None
        if record:
            self.channel.lease_book.out_of_hand(record)

    def ack(self, delivery_tag):
        if self._leased(delivery_tag):
            self._out_of_hand(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)
            return
        try:
            super().ack(delivery_tag)
        except BaseException:
            virtual.QoS.ack(self, delivery_tag)  # free the slot; Redis keeps the message unacked
            raise

    def reject(self, delivery_tag, requeue=False):
        if self._leased(delivery_tag):
            self._out_of_hand(delivery_tag)
            try:
                if requeue:
                    self.restore_by_tag(delivery_tag, leftmost=True)
            finally:
                virtual.QoS.ack(self, delivery_tag)
            return
        try:
            super().reject(delivery_tag, requeue=requeue)
        except BaseException:
            virtual.QoS.ack(self, delivery_tag)
            raise

    def restore_by_tag(self, tag, client=None, leftmost=False):
        if not self._leased(tag):
            return super().restore_by_tag(tag, client=client, leftmost=leftmost)
        message = self._delivered[tag]
        # From memory: Redis holds no copy. If this fails, the record's lease
        # runs out and the sweep republishes the task.
        delivery = message.delivery_info
        with self.channel.conn_or_acquire(client) as conn:
            self.channel._do_restore_message(message._raw, delivery["exchange"], delivery["routing_key"], conn,
                                             leftmost)
        return None


class Channel(kombu_redis.Channel):
    QoS = QoS

    def _connparams(self, asynchronous=False):
        # When Redis goes away, Celery closes the broker connection, and kombu
        # detaches the transport from it before every channel is closed. A
        # channel closed after that (or a running task's ack on it) needs a new
        # client to hand back its unacknowledged messages and fails with an
        # AttributeError, which Celery treats as unrecoverable: the worker
        # exited on a Redis restart (found by the fault campaign). Raise a
        # connection error instead, which Celery and kombu expect there: the
        # worker reconnects, and the messages stay in Redis's unacked hash, from
        # where kombu returns them to their queue after the visibility timeout.
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection was already closed")
        return super()._connparams(asynchronous=asynchronous)

    def close(self):
        # Closing reads a pending BRPOP's reply; a message in it has no consumer
        # left, and kombu hands it to the transport's first channel. On a warm
        # shutdown kombu has already taken every channel out of that list, so
        # the message was dropped without a word (fault scenario 2): point the
        # transport at this channel, which can still put it back.
        transport = self.connection
        if transport is not None:
            transport.closing_channel = self
        try:
            super().close()
        finally:
            if transport is not None:
                transport.closing_channel = None

    #: While delivering what POP_MORE took: the record it named in the in-hand set for this message.
    _popped_in_hand = ""
    #: The lanes whose doorbells the BRPOP in flight names: doorbell -> lane (its queue).
    _bells: dict[str, str]
    #: When each lane's lists were last all looked at (``time.monotonic()``).
    _looked_at_all: dict[str, float]
    #: The lists each lane's last doorbell token named: the pop behind the next BRPOP looks at those.
    _last_bits: dict[str, int]

    def __init__(self, *args, **kwargs):
        self._bells, self._looked_at_all, self._last_bits = {}, {}, {}
        super().__init__(*args, **kwargs)

    _sync_client: redis.Redis | None = None

    def _calls(self) -> redis.Redis:
        """The channel's client for its own synchronous calls (the pop, the poll's look, a ring): kombu's
        ``conn_or_acquire`` builds a new ``Redis`` object each time (its response callbacks and all), once
        a pop; this one is built once per connection pool (a reconnect makes a new pool, and so a new
        client; ``_connparams`` refuses a pool once the broker connection is closed)."""
        pool = self.pool
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = self._create_client()
        return client

    @cached_property
    def lease_book(self) -> leases.LeaseBook:
        """The process's lease book (``lanes.worker.LeaseBookStep``): what this channel pops is in its hand."""
        return leases.current()

    def _is_lane(self, queue: str) -> bool:
        # A global key prefix (not used by the platform) would have to reach the scripts' keys too.
        return not self.global_keyprefix and keys.is_lane_queue(queue)

    def _brpop_start(self, timeout=None):
        # kombu's, with each lane's doorbell in place of its lists (the lists of any other
        # queue stay, in kombu's order: priority first, then the channel's queue order).
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        bells = {keys.lane_doorbell(queue): queue for queue in queues if self._is_lane(queue)}
        lanes = set(bells.values())
        first = self.priority_steps[0]
        names = [keys.lane_doorbell(queue) if queue in lanes else self._q_for_pri(queue, pri)
                 for pri in self.priority_steps for queue in queues if queue not in lanes or pri == first]
        self._bells = bells
        connection = self._in_poll = self.client.connection
        self._brpop_sent_at = kombu_redis.monotonic()
        command_args = ["BRPOP", *names, timeout or 0]
        if self.global_keyprefix:
            command_args = self.client._prefix_args(command_args)
        self._pop_behind = call = self._pop_behind_brpop(lanes)
        if call is None:
            connection.send_command(*command_args)
        else:  # one write: Redis runs the pop as the BRPOP returns, no round trip of its own
            connection.send_packed_command(connection.pack_commands([command_args, call.call.command()]))

    #: The pop written behind the BRPOP in flight, or None.
    _pop_behind: PopBehind | None = None

    def _pop_behind_brpop(self, lanes: set[str]) -> PopBehind | None:
        """The lane's pop to write behind the BRPOP (``DISPATCH_POP_WITH_BRPOP``): a channel of one lane, the
        terms (room, claims) of now (acks grow the room while the BRPOP waits: ``_after_pop_behind`` takes
        the rest). The token is not known yet: the pop looks at the lists the last one
        named (a lane that keeps up rings the same ones), every list when they were not all looked at for a
        BRPOP timeout (as ``_take``); what the token names beyond them is taken once it is read."""
        if len(lanes) != 1 or self.global_keyprefix or not settings.DISPATCH_POP_WITH_BRPOP or self.closed:
            return None
        [lane] = lanes
        bits = None if self._due_for_every_list(lane, time.monotonic()) else self._last_bits.get(lane)
        book = self.lease_book
        claims = book.pop_claims() if book.pop_claims is not None else None
        lists = [self._q_for_pri(lane, pri) for pri in self.priority_steps]
        room = max(1, self._room())
        return PopBehind(lane, bits, room, pop_call(lane, lists, room, bits, book=book, claims=claims))

    def _read_pop_behind(self, behind: PopBehind | None) -> list[Popped] | None:
        """The reply of the pop written behind the BRPOP (read in every case: it follows the BRPOP's on the
        connection); None: none was written, or Redis refused it (``NOSCRIPT`` after a restart or a flush:
        the pop is then made the usual way, which loads the script)."""
        if behind is None:
            return None
        try:
            return popped_of(self.client.parse_response(self.client.connection, "EVALSHA"))
        except self.connection_errors:
            raise
        except redis.exceptions.ResponseError as exc:
            logger.info("pop_behind_brpop_refused lane=%s error=%s: popped the usual way", behind.lane, exc)
            return None

    def _brpop_read(self, **options):
        # kombu's, for three replies: a message of a queue that is not a lane (delivered as
        # kombu does), a lane's doorbell token (POP_MORE takes that lane's messages), or
        # nothing within the timeout (POP_MORE looks at every lane's lists anyway).
        bells, lane, token = self._bells, None, None
        behind, self._pop_behind = self._pop_behind, None
        popped: list[Popped] | None = None
        try:
            try:
                try:
                    dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
                finally:
                    popped = self._read_pop_behind(behind)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next iteration reconnects
                raise
            if dest__item:
                dest, item = dest__item
                dest = bytes_to_str(dest)
                lane = bells.get(dest)
                if lane is None:
                    queue = dest.rsplit(self.sep, 1)[0]
                    self._queue_cycle.rotate(queue)
                    self._deliver_popped(item, queue)
                    if popped and behind is not None:
                        self._deliver_all(behind.lane, popped)
                    return True
                token = bytes_to_str(item)
        finally:
            self._in_poll = None
            flush_reauth = getattr(self, "_flush_brpop_reauth", None)
            if flush_reauth is not None:
                flush_reauth()
        if popped is not None and behind is not None:
            delivered = self._after_pop_behind(behind, popped, token)
            if delivered:
                return True
            if delivered is not None:
                raise kombu_redis.Empty()
            # None: the BRPOP's timeout, and the pop did not look at every list: the poll below does
        elif lane is not None:
            self._queue_cycle.rotate(lane)
            if getattr(self, "_closing", False) or lane not in self.active_queues:
                # Closing, or the lane was cancelled (paused) since the BRPOP was sent: another
                # worker takes them.
                self._ring_again(lane, token)
                raise kombu_redis.Empty()
            if self._take(lane, self._token_read(lane, token)):
                return True
            raise kombu_redis.Empty()
        taken = 0
        active = self.active_queues
        polled = [lane for lane in dict.fromkeys(bells.values()) if lane in active]
        if not polled or getattr(self, "_closing", False) or not self._holds_any(polled):
            raise kombu_redis.Empty()
        for lane in polled:
            if getattr(self, "_closing", False) or (taken and self._room() <= 0):
                break
            taken += self._take(lane, None)
        if taken:
            return True
        raise kombu_redis.Empty()

    @property
    def _every_list(self) -> int:
        """A lane's lists as doorbell bits: all of them."""
        return (1 << len(self.priority_steps)) - 1

    def _due_for_every_list(self, lane: str, now: float) -> bool:
        """Whether ``lane``'s lists were not all looked at for a BRPOP timeout: its next pop looks at every one."""
        return now - self._looked_at_all.get(lane, 0.0) >= self.brpop_timeout

    def _token_read(self, lane: str, token: str) -> int | None:
        """The lists ``token`` names, kept for the pop behind the next BRPOP."""
        bits = _token_bits(token)
        if bits is None:
            self._last_bits.pop(lane, None)
        else:
            self._last_bits[lane] = bits
        return bits

    def _after_pop_behind(self, behind: PopBehind, popped: list[Popped], token: str | None) -> bool | None:
        """Act on what the pop behind the BRPOP took, as it ran when the BRPOP returned (a token, or its
        timeout): delivered as ``_take`` delivers, then the lists the token names that it did not look at
        taken as usual; closing, or the lane cancelled (paused) since, handed back, and the token rung again.
        Returns whether it delivered anything; None after a timeout when the pop did not look at every
        list and found nothing: the poll is still to make."""
        lane, looked = behind.lane, behind.bits
        every = self._every_list
        if looked is None:
            self._looked_at_all[lane] = time.monotonic()
        named = every if token is None else (self._token_read(lane, token) or every)
        rest = named & ~(every if looked is None else looked)
        self._queue_cycle.rotate(lane)
        if getattr(self, "_closing", False) or lane not in self.active_queues:
            if popped:
                self._hand_back_all(popped)  # as a rejected message: each rings its list
            if token is not None and (rest or not popped):
                self._ring_again(lane, str(rest or named))  # another worker takes them
            return False
        if popped:
            self._deliver_all(lane, popped)
            if len(popped) >= behind.room and self._room() > 0:
                # It filled the room it had when it was written, the smallest the room was (acks grew it
                # while the BRPOP waited): what more there is is taken now, in the same delivery, so a
                # burst is not taken one message a pop (a batched type behind a limit was fed one item a
                # batch so).
                self._take(lane, looked)
        if token is not None and rest:
            return self._take(lane, rest) > 0 or bool(popped)
        if token is None and rest and not popped:
            return None
        return bool(popped)

    def _get(self, queue):
        # A synchronous get (``basic_get``, kombu's ``Queue.get``) of a lane takes its message with
        # POP_MORE too, so it is in the in-hand set as it leaves its list; basic_get's QoS.append
        # finds it already written.
        if not self._is_lane(queue):
            return super()._get(queue)
        lists = [self._q_for_pri(queue, pri) for pri in self.priority_steps]
        client = self._calls()
        popped = pop_more(client, queue, lists, 1, None, book=self.lease_book)
        self._maybe_update_queues_expire(client, queue)
        if not popped:
            raise kombu_redis.Empty()
        [popped_item] = popped  # room for one
        self._popped_in_hand = popped_item.record
        return _message_of(popped_item)

    def basic_get(self, queue, no_ack=False, **kwargs):
        try:
            return super().basic_get(queue, no_ack=no_ack, **kwargs)
        finally:
            self._popped_in_hand = ""

    def _holds_any(self, lanes: list[str]) -> bool:
        """Whether any list of ``lanes`` holds a message (one EXISTS: an idle worker's poll costs
        one command a second, whatever its lanes)."""
        names = [self._q_for_pri(lane, pri) for lane in lanes for pri in self.priority_steps]
        return bool(self._calls().exists(*names))

    def _room(self) -> int:
        estimate = self.qos.can_consume_max_estimate()
        return POP_MORE_MAX if estimate is None else min(estimate, POP_MORE_MAX)

    def _take(self, lane: str, bits: int | None) -> int:
        """Take what the prefetch window has room for (at least one) from ``lane``'s lists, in one
        call that names each record in the in-hand set, and deliver it; returns how many.

        ``bits``: the lists a doorbell token names; None, or the lane's lists were not all looked
        at for a BRPOP timeout: every list (a push that did not ring, a token lost with a killed
        worker, is found within that time even on a lane whose doorbell never stops ringing).
        """
        if self.closed or self.connection is None:
            return 0
        now = time.monotonic()
        if bits is not None and self._due_for_every_list(lane, now):
            bits = None
        if bits is None:
            self._looked_at_all[lane] = now
        lists = [self._q_for_pri(lane, pri) for pri in self.priority_steps]
        book = self.lease_book
        # The claim at the pop: a worker whose run threads wait for work has them claimed here (one round
        # trip less a task); what runs them takes each claim from the book (tasks.grouping).
        claims = book.pop_claims() if book.pop_claims is not None else None
        popped = pop_more(self._calls(), lane, lists, max(1, self._room()), bits, book=book, claims=claims)
        self._deliver_all(lane, popped)
        return len(popped)

    def _deliver_all(self, lane: str, popped: list[Popped]) -> None:
        """Deliver what a pop of ``lane`` took, each claim in the book first."""
        book = self.lease_book
        try:
            for item in popped:
                self._popped_in_hand = item.record
                if item.owner:
                    book.claimed_at_pop(item.record, item)
                self._deliver_popped(item, lane)
        finally:
            self._popped_in_hand = ""

    def _hand_back_all(self, popped: list[Popped]) -> None:
        """Put what a pop took back in its lane, as a rejected message is (``QoS.reject``, requeued; it rings):
        a claim the pop made is let go with it, and its lease brings the task back, as any claim nothing took."""
        book = self.lease_book
        try:
            for item in popped:
                self._popped_in_hand = item.record
                if item.owner:
                    book.claimed_at_pop(item.record, item)
                try:
                    message = self.Message(_written_of(item).raw, channel=self)
                except Exception as exc:  # noqa: BLE001 - as _deliver_popped: an undecodable one is dropped
                    self._drop_unreadable(item, exc)
                    continue
                self.qos.append(message, message.delivery_tag)
                self.qos.reject(message.delivery_tag, requeue=True)
        finally:
            self._popped_in_hand = ""

    def _ring_again(self, lane: str, token: str | None) -> None:
        """Put back a doorbell token this channel took and will not act on."""
        bits = _token_bits(token)
        try:
            ring(self._calls(), lane, self._every_list if bits is None else bits)
        except Exception:  # the other workers' poll finds the messages within a second
            logger.warning("doorbell_not_rung_again lane=%s", lane, exc_info=True)

    def _put(self, queue, message, **kwargs):
        # A message published through this transport onto a lane (not the platform's own
        # publish, which rings in its script) rings too. Batched publishing (kombu's
        # publish_batch) does not: the workers' poll finds it within a second.
        batched = kwargs.get("_publish_batch") is not None
        super()._put(queue, message, **kwargs)
        if self._is_lane(queue) and not batched:
            with self.conn_or_acquire() as client:
                ring(client, queue, 1 << self.priority(self._get_message_priority(message, reverse=False)))

    def _do_restore_message(self, payload, exchange, routing_key, pipe, leftmost=False):
        # A message handed back to a lane (from memory or kombu's unacked hash) rings, in the
        # same transaction when ``pipe`` is one.
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        try:
            lanes = [queue for queue in self._lookup(exchange, routing_key) if self._is_lane(queue)]
            if lanes:
                bit = 1 << self.priority(self._get_message_priority(payload, reverse=False))
                for lane in lanes:
                    ring(pipe, lane, bit)
        except self.connection_errors:
            raise
        except Exception:  # as kombu's own restore: the poll finds the message within a second
            logger.error("doorbell_not_rung lane_of=%r", routing_key, exc_info=True)

    def _taker(self, item: bytes | Popped, raw: dict, queue: str) -> Callable[[Any], None] | None:
        """Who takes a popped platform message straight from the pop (``LeaseBook.taker_of``: a grouping
        worker's runner), or None: kombu's delivery (its consumer callback, then Celery's dispatch by task
        name). Only a record's message on a consumed queue of an acking consumer, as kombu would deliver it."""
        taker_of = self.lease_book.taker_of
        if (taker_of is None or not isinstance(item, Popped) or not item.tag or self.no_ack_consumers
                or queue not in self.connection._callbacks):
            return None
        return taker_of(raw)

    def _deliver_popped(self, item: bytes | Popped, queue: str) -> None:
        try:
            written = _written_of(item)
            raw = written.raw
            take = self._taker(item, raw, queue)
            if take is None:
                self.connection._deliver(raw, queue)
            else:  # as kombu's basic_consume callback, then straight to the runner (no consumer dispatch)
                message = self.Message(raw, channel=self)
                # The body's parts as written, so the runner parses the payload once, the envelope not again.
                setattr(message, WRITTEN_ATTRIBUTE, written)
                self.qos.append(message, message.delivery_tag)
                take(message)
        except self.connection_errors:
            raise
        except Exception as exc:  # noqa: BLE001 - any undecodable message must not end the worker
            self._drop_unreadable(item, exc)

    def _drop_unreadable(self, item: bytes | Popped, exc: Exception) -> None:
        logger.error("undecodable_message_dropped error=%r", exc)
        if isinstance(item, Popped) and item.owner and self.lease_book.take_claimed_at_pop(item.record):
            self.lease_book.release(item.record)  # claimed, never to run here: its lease brings it back
        _report_unreadable(exc)


def _message_of(item: bytes | Popped) -> dict:
    """The kombu message of a popped item (:func:`_written_of`'s ``raw``)."""
    return _written_of(item).raw


def _written_of(item: bytes | Popped) -> Written:
    """A popped item's kombu message with the parts it was written from: a record's stored message written out
    (``lanes.messages``), or a whole message decoded (no parts)."""
    if isinstance(item, Popped):
        if item.tag:
            return written_message(item.message, item.tag.rpartition(".")[0], item.record, item.tag)
        item = item.message
    return Written(loads(bytes_to_str(item)))


class PopBehind(NamedTuple):
    """The pop written behind a BRPOP: its lane, the lists it looks at (None: every one), its room, its call."""

    lane: str
    bits: int | None
    room: int
    call: PopCall


def _token_bits(token: str | None) -> int | None:
    """The lists a doorbell token names (bit p: kombu priority p); None: unreadable, every list."""
    try:
        return int(token) if token is not None else None
    except ValueError:
        return None


def _report_unreadable(exc: Exception) -> None:
    """Tell the receivers of ``message_unreadable`` (the dead-letter recorder); never raise."""
    responses = message_unreadable.send_robust(
        sender=Transport, task_id=f"malformed-{uuid.uuid4()}",
        message=f"a message on a lane queue could not be decoded: {exc!r}", exc=exc,
    )
    for receiver, response in responses:
        if isinstance(response, Exception):
            logger.error("malformed_record_failed receiver=%r", receiver, exc_info=response)


#: The channel class above, by a name the Transport's ``Channel`` attribute does not shadow.
LaneChannel = Channel


class UndeliverableMessage(Exception):
    """A popped message kombu cannot turn into a Message (a field it needs is missing)."""


class Transport(kombu_redis.Transport):
    Channel = Channel
    closing_channel: LaneChannel | None = None

    def register_with_event_loop(self, connection, loop):
        """kombu's, with a leaner tick: kombu's own tick (``on_poll_start``) hands every socket of the poller to
        the hub again each turn of the loop (``add_reader``: an ``epoll.register`` answered EEXIST, raised and
        caught, per socket per turn). This one hands over only a socket the hub does not already read with
        this transport's callback: one newly registered, resumed after a full prefetch window
        (``_pause_brpop`` removed its reader) or reconnected (kombu's disconnect hook removed it)."""
        before = set(loop.on_tick)
        super().register_with_event_loop(connection, loop)
        for tick in set(loop.on_tick) - before:  # kombu's closure: cycle.on_poll_start + add_reader per fd
            loop.on_tick.discard(tick)
        cycle = self.cycle
        cycle_poll_start = cycle.on_poll_start
        add_reader = loop.add_reader
        on_readable = self.on_readable

        def on_poll_start():
            cycle_poll_start()
            readers, paused = loop.readers, cycle._paused_brpop
            for fd in cycle._fd_to_chan:
                if fd in paused:
                    continue
                entry = readers.get(fd)
                if entry is None or entry[1] != (fd,) or entry[0] != on_readable:
                    add_reader(fd, on_readable, fd)

        loop.on_tick.add(on_poll_start)

    def _reject_inbound_message(self, raw_message):
        if self.channels or self.closing_channel is None:
            return super()._reject_inbound_message(raw_message)
        channel = self.closing_channel
        message = channel.Message(raw_message, channel=channel)
        channel.qos.append(message, message.delivery_tag)
        channel.basic_reject(message.delivery_tag, requeue=True)
        logger.info("popped_message_requeued_at_close tag=%s", message.delivery_tag)

    def _deliver(self, message, queue):
        # kombu lists KeyError among the Redis transport's *connection* errors, so
        # a JSON message without the fields kombu reads ('properties', a delivery
        # tag) made the worker drop its broker connection and reconnect (restoring
        # what it held), with no trace of the message: found by the fault
        # campaign's hostile input. Such a message is malformed, not a lost link.
        try:
            return super()._deliver(message, queue)
        except KeyError as exc:
            raise UndeliverableMessage(f"missing field {exc}") from exc


class SentinelLaneChannel(LaneChannel, kombu_redis.SentinelChannel):
    """The lane channel (same QoS, same hardening) on the master that Redis Sentinel names.

    kombu's ``SentinelChannel`` builds its connection pool from
    ``sentinel.master_for``: a connection opened after a failover reaches the
    new master, and one still open to the old master fails, which Celery
    handles as a lost broker connection (the worker reconnects by itself).
    """


class SentinelTransport(Transport):
    """``lanes.transport:Transport`` through Redis Sentinel (``REDIS_URL=sentinel://...``)."""

    default_port = kombu_redis.SentinelTransport.default_port  # type: ignore[assignment]  # kombu types it None
    Channel = SentinelLaneChannel
