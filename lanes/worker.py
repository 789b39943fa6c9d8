"""Worker bootsteps of the engine (wired by path in ``dispatchsite.celery``).

- The process's lease book (``lanes.leases.LeaseBook``) is made first: the
  transport, the pop and the execution path take it from there.
- A worker that starts while one of its lanes is paused does not consume it,
  and joins the lane's paused workers so ``resume`` starts it there too.
- (The dashboard charts' sampler is ``ops.worker_steps.MetricsSamplerStep``,
  wired in dispatchsite/celery.py.)
- A thread writes the worker's heartbeat every two seconds: the queues it
  consumes (and paused lanes it will resume), so every view can say which lane
  has no consumer (``lanes.consumers``). With ``DISPATCH_CATCH_ALL=1`` it also
  makes the worker consume every configured lane that no live worker holds,
  lanes created at run time included, and give one back when a dedicated worker
  for it appears.
- ``kill -USR2 <pid>`` writes every thread's stack to the worker's log, in the
  main process and in pool children alike (a hung worker can be diagnosed
  without a debugger).
- What the start imported is frozen out of the garbage collector before the
  pool forks (``gc.freeze``), so each fork's full collection skips it.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time

from celery import bootsteps
from django.conf import settings

from lanes import consumers, keys, leases
from lanes.models import Lane
from lanes.redis_client import get_redis

logger = logging.getLogger(__name__)


class LeaseBookStep(bootsteps.Step):
    """The worker process's lease book, made before its consumer pops or its pool forks (``lanes.leases``)."""

    def __init__(self, worker, **kwargs):
        leases.install(leases.LeaseBook())


class GcFreezeStep(bootsteps.Step):
    """Freeze the start's objects (modules, classes, settings) out of the garbage collector before the pool forks.

    Celery's prefork pool runs a full ``gc.collect()`` before each child it forks (at the start, and at each
    restart of a child): about 0.09 s of CPU a child over the 130,000 objects a start leaves, none of them
    garbage. Frozen, a collection skips them, in this process and in the children, which then share those
    pages instead of copying them when the collector writes to them (CPython's advice for a fork without an
    exec). Every step's ``__init__`` runs before any step starts, and the pool forks at its start: by then
    Django is set up and the handlers are imported. Objects made later are collected as usual.
    """

    def __init__(self, worker, **kwargs):
        gc.freeze()


class StackDumpStep(bootsteps.Step):
    """SIGUSR2 dumps all threads' stacks; prefork children inherit the handler."""

    def __init__(self, worker, **kwargs):
        faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True)


class PausedLanesStep(bootsteps.Step):
    """Deselect paused lanes before the consumer starts."""

    def __init__(self, worker, **kwargs):
        try:
            client = get_redis()
            paused = {m.decode() for m in client.smembers(keys.PAUSED_LANES)}
            queues = worker.app.amqp.queues
            for lane in sorted(paused & set(queues.consume_from)):
                queues.deselect(lane)
                client.sadd(keys.paused_workers(lane), worker.hostname)
                logger.warning("lane_paused_at_start lane=%s worker=%s", lane, worker.hostname)
        except Exception:  # fail open: a worker that cannot check consumes as asked
            logger.exception("paused_lanes_check_failed")


class HeartbeatStep(bootsteps.StartStopStep):
    """Heartbeats with the queues held; on a catch-all worker, adopts the lanes nobody holds."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, **kwargs):
        self.stopping = threading.Event()
        self.worker = worker
        self.catch_all = bool(getattr(settings, "DISPATCH_CATCH_ALL", False))
        self.started = time.time()
        self.adopted: set[str] = set()
        self.reported: set[str] = set()
        self._lanes: tuple[bytes | None, list[str]] = (b"", [])

    def start(self, worker) -> None:
        self._tick()  # the first beat before the worker says it is ready
        leases.current().keep_alive()  # this process's liveness: what it pops is reclaimed soon after its death
        threading.Thread(target=self._loop, name="dispatch-heartbeat", daemon=True).start()

    def stop(self, worker) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        try:
            consumers.clear_heartbeat(get_redis(), worker.hostname, self.reported)
        except Exception:  # the beat expires by itself
            logger.warning("heartbeat_clear_failed", exc_info=True)

    terminate = stop

    def _loop(self) -> None:
        while not self.stopping.wait(consumers.HEARTBEAT_INTERVAL_S):
            self._tick()

    def _consumed(self) -> list[str]:
        for _ in range(3):  # the consumer's thread may change the dict while we copy it
            try:
                return sorted(self.worker.app.amqp.queues.consume_from or ())
            except RuntimeError:
                continue
        return sorted(self.reported)

    def _tick(self) -> None:
        try:
            client = get_redis()
            now = time.time()
            beat = consumers.Heartbeat(
                hostname=self.worker.hostname, pid=os.getpid(), host=socket.gethostname(), started=self.started,
                queues=self._consumed(), paused=consumers.held_paused(client, self.worker.hostname),
                catch_all=self.catch_all, adopted=sorted(self.adopted), stuck=self._stuck())
            held = set(beat.held)
            consumers.write_heartbeat(client, beat, self.reported - held, now)
            self.reported = held
            if self.catch_all and now - self.started >= consumers.ADOPT_GRACE_S:
                self._adopt(client, beat, now)
        except Exception:  # a missed beat shows as "no worker" after the TTL, never a worker failure
            logger.warning("heartbeat_failed", exc_info=True)

    def _stuck(self) -> int:
        # The worker's grouping runner (tasks.grouping) sets this on the worker when it has one.
        count = getattr(self.worker, "dispatch_stuck_threads", None)
        return int(count()) if callable(count) else 0

    def _configured_lanes(self, client) -> list[str]:
        """Lane names, read again from the database only when the config version moved."""
        version = client.get(keys.CONFIG_VERSION)
        if version != self._lanes[0]:
            self._lanes = (version, list(Lane.objects.values_list("name", flat=True)))
        return self._lanes[1]

    def _adopt(self, client, beat: consumers.Heartbeat, now: float) -> None:
        consumer = self.worker.consumer
        if consumer is None or consumer.task_consumer is None:
            return  # not connected yet (or reconnecting): try at the next beat
        configured = self._configured_lanes(client)
        holders = consumers.read_holders(client, set(configured) | self.adopted, now)
        catch_alls = [w.hostname for w in consumers.read_workers(client, now) if w.catch_all]
        for lane in consumers.to_release(self.adopted & set(beat.queues), configured, holders, catch_alls,
                                         beat.hostname):
            self.adopted.discard(lane)
            logger.warning("catch_all_release lane=%s worker=%s", lane, beat.hostname)
            consumer.call_soon(_safely, consumer.cancel_task_queue, lane)
        paused = {m.decode() for m in client.smembers(keys.PAUSED_LANES)}
        for lane in consumers.unclaimed(configured, holders, beat.held):
            self.adopted.add(lane)
            if lane in paused:  # hold it as a paused worker: resume starts it here
                client.sadd(keys.paused_workers(lane), beat.hostname)
                logger.warning("catch_all_adopt_paused lane=%s worker=%s", lane, beat.hostname)
                continue
            logger.warning("catch_all_adopt lane=%s worker=%s", lane, beat.hostname)
            consumer.call_soon(_safely, consumer.add_task_queue, lane)


def _safely(call, lane: str) -> None:
    """Run in the consumer's loop: a failure is logged, never raised into the loop."""
    try:
        call(lane)
    except Exception:
        logger.exception("catch_all_queue_change_failed lane=%s", lane)

