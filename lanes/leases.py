"""Running tasks' leases: kept fresh while they run, and finished records settled.

A ``LeaseBook`` owns the messages of one worker process from pop to settle:
the transport names what it popped (``take_in_hand``, ``out_of_hand``), an
attempt holds its claim's lease while its handler runs (``hold``,
``release``) and queues its finished record (``settle``). The worker wiring
(``lanes.worker.LeaseBookStep``) makes the process's book before anything
pops or claims, and ``current`` hands it to the transport, the pop and the
execution path; a process the worker wiring did not set up (a test, a shell)
gets one on first use. A forked child (a prefork pool process) finds its
parent's book empty: the parent's messages and its thread are not the child's.

One daemon thread per book renews every running task's lease in one
pipelined call each ``lease/3`` seconds; a task whose process dies stops being
renewed, and the recovery sweep republishes it once the lease runs out.

The same thread settles finished tasks: ``finish.lua`` leaves the record under
a short lease until the result row is stored (the broker keeps no copy of a
platform message once delivered: ``lanes.transport``); the worker then queues
it here, and every ``SETTLE_EVERY_S`` one ``forget.lua`` call removes all that
were queued. Batched, settling costs a fraction of a Redis round trip per task
instead of kombu's two (record as unacked, then ack).

The same thread keeps the process's *liveness* (docs/liveness.md): every
``LIVENESS_BEAT_S`` one pipelined call writes ``host:pid`` into ``keys.PROCS``
with a ``LIVENESS_TTL_S`` expiry, carries the lease renewals when they are due
(so a busy process pays no extra round trip for them), removes records it no
longer holds from its held and in-hand sets, and reads the process list, so
that it can speak for the other processes of its host: one whose pid is gone is
declared dead at once, one whose pid exists but whose beat is late (stopped,
starved) is vouched for, and its claims are left to their leases.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings

from lanes import keys
from lanes.forksafe import ForkSafeLock
from lanes.lua.forget import forget
from lanes.redis_client import get_redis

logger = logging.getLogger(__name__)
#: This host's name in owner ids and process ids; ``DISPATCH_HOST_ID`` overrides it
#: (the fault harness simulates several hosts on one machine).
HOST = os.environ.get("DISPATCH_HOST_ID") or socket.gethostname()
#: Seconds between two liveness beats of a process.
LIVENESS_BEAT_S = 1.0
#: Seconds a process counts as alive after its last beat (a killed process's
#: claims are reclaimed this long after its death at most, sooner when another
#: process of its host sees its pid gone).
LIVENESS_TTL_S = 5.0
#: A process of this host whose beat is this late is looked at by its peers.
PEER_LATE_S = 2 * LIVENESS_BEAT_S
#: Seconds between settling calls (while any finished task waits to be settled).
SETTLE_EVERY_S = 0.1
#: Most records one settling call removes; the rest wait for the next call.
SETTLE_BATCH = 500
#: Most records waiting to be settled; past this the oldest are left to the
#: sweep (Redis unreachable for long): their copies re-store the result and settle.
SETTLE_BACKLOG_MAX = 20000


class LeaseBook:
    """The in-hand messages, running claims and records to settle of one worker process."""

    def __init__(self) -> None:
        self._lock = ForkSafeLock()
        self._start_empty()
        os.register_at_fork(after_in_child=functools.partial(_empty_in_child, weakref.ref(self)))

    def _start_empty(self) -> None:
        # Also in a forked child: the parent's messages and renewal thread are not the child's.
        self._running: dict[str, int] = {}
        self._settling: list[str] = []
        self._thread: threading.Thread | None = None
        self._thread_pid: int | None = None
        #: Records released (no longer running here) -> when; removed from the held set a beat later.
        self._unheld: dict[str, float] = {}
        #: Records whose message this process popped and has not acked (count per record).
        self._in_hand: dict[str, int] = {}
        #: Records acked or handed back since the last beat (to remove from the in-hand set).
        self._out_of_hand: set[str] = set()
        #: Records popped and not yet written to the in-hand set (the lease thread writes them at once).
        self._in_hand_unsent: set[str] = set()
        #: Set when a record is popped: wakes the lease thread to write it.
        self._in_hand_wake = threading.Event()
        #: The process list as read at the last beat: (process id, expiry ms).
        self._peers: list[tuple[str, float]] = []
        #: True once a beat of this process reached Redis: from then on its beat keeps its liveness
        #: entry, and a claim or a pop need not register it again (a command less each).
        self._beaten = False
        #: Records the pop claimed (``pop_more.lua``'s claim at the pop) that nothing has taken to run yet.
        self._claimed_at_pop: dict[str, Any] = {}
        #: Set by a worker whose run threads take messages claimed at the pop (``tasks.grouping.Runner``):
        #: what the next pop may claim (``lanes.lua.pop_more.PopClaims``), or None.
        self.pop_claims: Callable[[], Any] | None = None
        #: Set by the same runner: given a popped platform message (kombu's raw dict), the callable that takes
        #: its kombu ``Message`` straight from the pop (the channel's QoS holds it already), or None for
        #: kombu's delivery to Celery's consumer (``lanes.transport.Channel._deliver_popped``).
        self.taker_of: Callable[[dict], Callable[[Any], None] | None] | None = None

    def registered(self) -> bool:
        """Whether this process's liveness entry was written by one of its beats (claims need not write it)."""
        return self._beaten

    def liveness_ms(self) -> int:
        """What a claim passes as its liveness: 0 once a beat registered the process, else the TTL in ms."""
        return 0 if self._beaten else int(LIVENESS_TTL_S * 1000)

    def hold(self, record: str) -> None:
        """``record``'s claim runs here: its lease is renewed until ``release``."""
        with self._lock:
            self._running[record] = self._running.get(record, 0) + 1
        self._ensure_thread()

    def release(self, record: str) -> None:
        with self._lock:
            left = self._running.get(record, 0) - 1
            if left > 0:
                self._running[record] = left
            else:
                self._running.pop(record, None)
                self._unheld[record] = time.monotonic()

    def claimed_at_pop(self, record: str, claim: Any) -> None:
        """The pop claimed ``record`` (``claim``: its ``Popped``): its lease is renewed from now on, while it
        waits for a run thread too, until what runs it releases it."""
        with self._lock:
            self._claimed_at_pop[record] = claim
        self.hold(record)

    def take_claimed_at_pop(self, record: str) -> Any | None:
        """The pop's claim of ``record`` for what runs it, held (release it when done); None if it has none."""
        with self._lock:
            return self._claimed_at_pop.pop(record, None)

    def keep_alive(self) -> None:
        """Start beating now (a worker's main process, before it pops anything)."""
        self._ensure_thread()

    def take_in_hand(self, record: str, written: bool = False) -> None:
        """A worker main process popped ``record``'s message: have it named in the process's in-hand set.

        ``written``: the pop wrote it already, as every pop of a lane list does
        (``lanes/lua/pop_more.lua``, docs/liveness.md): only kept in memory here, so
        the ack costs nothing (removed at the next beat). Otherwise (a leased
        message that reached a worker some other way) the lease thread writes it,
        woken at once and batching every record popped meanwhile into one ``SADD``,
        so the event loop never waits on Redis for it.
        """
        with self._lock:
            self._in_hand[record] = self._in_hand.get(record, 0) + 1
            self._out_of_hand.discard(record)
            if not written:
                self._in_hand_unsent.add(record)
        self._ensure_thread()
        if not written:
            self._in_hand_wake.set()

    def send_in_hand(self) -> None:
        """Write the records popped since the last call into the in-hand set (one call; the lease thread's)."""
        with self._lock:
            unsent = list(self._in_hand_unsent)
            self._in_hand_unsent.clear()
        if not unsent:
            return
        me = process_id()
        try:
            if self._beaten:
                get_redis().sadd(keys.process_in_hand(me), *unsent)
            else:  # registers the process's liveness too, if no beat did yet
                pipe = get_redis().pipeline(transaction=False)
                pipe.sadd(keys.process_in_hand(me), *unsent)
                pipe.zadd(keys.PROCS, {me: liveness_expiry_ms()}, nx=True)
                pipe.execute()
        except Exception:
            with self._lock:  # the next call or beat sends them again
                self._in_hand_unsent.update(r for r in unsent if r in self._in_hand)
            logger.warning("in_hand_write_failed records=%d", len(unsent), exc_info=True)

    def out_of_hand(self, record: str) -> None:
        """The message of ``record`` was acked or handed back: no Redis call now. A claim the pop made that
        nothing took to run is let go: its lease runs out and the sweep hands the task on."""
        with self._lock:
            left = self._in_hand.get(record, 0) - 1
            if left > 0:
                self._in_hand[record] = left
            else:
                self._in_hand.pop(record, None)
                self._in_hand_unsent.discard(record)
                self._out_of_hand.add(record)
            untaken = self._claimed_at_pop.pop(record, None)
        if untaken is not None:
            logger.warning("pop_claim_untaken record=%s: its lease brings it back", record)
            self.release(record)

    def settle(self, record: str) -> None:
        """Queue a finished task's record for removal: its result row is stored."""
        with self._lock:
            self._settling.append(record)
            if len(self._settling) > SETTLE_BACKLOG_MAX:
                del self._settling[: len(self._settling) - SETTLE_BACKLOG_MAX]
        self._ensure_thread()

    def settle_now(self) -> None:
        """Remove every queued finished record now, one call per batch."""
        while True:
            with self._lock:
                batch = self._settling[:SETTLE_BATCH]
                del self._settling[:SETTLE_BATCH]
            if not batch:
                return
            try:
                forget(batch)
            except Exception:
                with self._lock:
                    self._settling[:0] = batch  # Redis away: keep them for the next call
                logger.warning("settle_failed records=%d", len(batch), exc_info=True)
                return

    def _ensure_thread(self) -> None:
        thread = self._thread
        if thread is not None and self._thread_pid == os.getpid() and thread.is_alive():
            return
        with self._lock:
            thread = self._thread
            if thread is not None and self._thread_pid == os.getpid() and thread.is_alive():
                return
            self._thread_pid = os.getpid()
            self._thread = threading.Thread(target=self._tend_forever, name="dispatch-lease", daemon=True)
            self._thread.start()

    def _tend_forever(self) -> None:
        lease_s = settings.DISPATCH_LEASE_S
        renew_every = max(0.2, lease_s / 3)
        next_renewal = time.monotonic() + renew_every
        next_beat = next_settle = 0.0
        while True:
            self._in_hand_wake.clear()
            self.send_in_hand()
            now = time.monotonic()
            if self._settling and now >= next_settle:
                next_settle = now + SETTLE_EVERY_S
                self.settle_now()
            renew = now >= next_renewal
            if renew or now >= next_beat:
                if renew:
                    next_renewal = now + renew_every
                next_beat = now + LIVENESS_BEAT_S
                self.beat(lease_s, renew)
            # Popped messages wake it at once; otherwise the next settle, beat or renewal.
            wake_at = min(next_beat, next_renewal, next_settle if self._settling else now + SETTLE_EVERY_S)
            self._in_hand_wake.wait(max(0.0, wake_at - time.monotonic()))

    def beat(self, lease_s: float, renew: bool) -> None:
        """One pipelined call: liveness, lease renewals (when due), set upkeep, peers' fate."""
        now = time.time()
        now_ms = int(now * 1000)
        until_ms = int((now + LIVENESS_TTL_S) * 1000)
        me = process_id()
        with self._lock:
            running = list(self._running) if renew else []
            settling = set(self._settling)
            cutoff = time.monotonic() - LIVENESS_BEAT_S  # released a beat ago: settled by now if it will be
            unheld = [r for r, at in self._unheld.items()
                      if at <= cutoff and r not in self._running and r not in settling]
            for record in unheld:
                del self._unheld[record]
            gone = [r for r in self._out_of_hand if r not in self._in_hand]
            self._out_of_hand.clear()
            unsent = list(self._in_hand_unsent)
            self._in_hand_unsent.clear()
            peers = list(self._peers)
        dead, vouched = judge_peers(peers, now_ms, me)
        pipe = get_redis().pipeline(transaction=False)
        pipe.zadd(keys.PROCS, {me: until_ms})
        if running:
            pipe.zadd(keys.LEASES, {record: int((now + lease_s) * 1000) for record in running}, xx=True)
        if unheld:
            pipe.srem(keys.process_held(me), *unheld)
        if gone:
            pipe.srem(keys.process_in_hand(me), *gone)
        if unsent:
            pipe.sadd(keys.process_in_hand(me), *unsent)
        if dead:
            pipe.zadd(keys.PROCS, dict.fromkeys(dead, 0), xx=True)
            pipe.zrem(keys.PROCS_VOUCHED, *dead)  # vouched for while it lived (late, starved): dead now
        if vouched:
            pipe.zadd(keys.PROCS_VOUCHED, dict.fromkeys(vouched, until_ms))
        pipe.zrange(keys.PROCS, 0, -1, withscores=True)
        try:
            replies = pipe.execute()
        except Exception as exc:
            with self._lock:
                self._out_of_hand.update(gone)
                self._in_hand_unsent.update(r for r in unsent if r in self._in_hand)
                for record in unheld:
                    self._unheld.setdefault(record, 0.0)
            # Redis away is an expected state (restart, failover): one line, retried next beat.
            expected = isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
            logger.warning("liveness_beat_failed renewals=%d error=%s", len(running), exc, exc_info=not expected)
            return
        self._beaten = True
        with self._lock:
            self._peers[:] = [(m.decode() if isinstance(m, bytes) else str(m), float(score))
                              for m, score in replies[-1]]
        if dead:
            logger.warning("peer_processes_dead processes=%s", ",".join(dead))


def _empty_in_child(ref: weakref.ref[LeaseBook]) -> None:
    book = ref()
    if book is not None:
        book._start_empty()


#: The process's book (``install``, ``current``).
_installed: LeaseBook | None = None
_install_lock = ForkSafeLock()


def install(book: LeaseBook) -> LeaseBook:
    """Make ``book`` this process's (the worker wiring, before the worker pops or claims)."""
    global _installed
    with _install_lock:
        _installed = book
    return book


def current() -> LeaseBook:
    """This process's book; one made now if the worker wiring made none (a test, a shell)."""
    global _installed
    book = _installed
    if book is None:
        with _install_lock:
            book = _installed = _installed or LeaseBook()
    return book


def process_id(pid: int | None = None) -> str:
    """``host:pid`` of this process (or of ``pid`` on this host): the key of its liveness."""
    return f"{HOST}:{pid if pid is not None else os.getpid()}"


def owner_id() -> str:
    return f"{process_id()}:{threading.get_ident()}"


def owner_is_dead_here(owner: str) -> bool:
    """True when ``owner`` ran on this host in a process that no longer exists."""
    try:
        host, pid, _thread_id = owner.rsplit(":", 2)
        pid_n = int(pid)
    except ValueError:
        return False
    if host != HOST or pid_n == os.getpid():
        return False
    try:
        os.kill(pid_n, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def liveness_expiry_ms() -> int:
    """The expiry a liveness entry written now carries (``keys.PROCS`` score)."""
    return int((time.time() + LIVENESS_TTL_S) * 1000)


def judge_peers(peers: list[tuple[str, float]], now_ms: int, me: str) -> tuple[list[str], list[str]]:
    """Processes of this host whose beat is late: (pid gone: dead now, pid there: vouched for).

    A process that exists, stopped (SIGSTOP) or starved, is not dead: it may
    wake and finish its effect, so its claims are left to their leases. A
    zombie (killed, not yet reaped) is dead.
    """
    dead: list[str] = []
    vouched: list[str] = []
    late_ms = now_ms + (LIVENESS_TTL_S - PEER_LATE_S) * 1000
    for proc, expiry in peers:
        if proc == me or expiry <= 0 or expiry > late_ms:
            continue
        host, _, pid = proc.rpartition(":")
        if host != HOST or not pid.isdigit():
            continue
        (vouched if pid_exists(int(pid)) else dead).append(proc)
    return dead, vouched


def pid_exists(pid: int) -> bool:
    """True when ``pid`` is a process of this machine that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
