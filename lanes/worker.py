"""Worker bootsteps of the operator's view (imported by the Celery app's ``imports``).

- A worker that starts while one of its lanes is paused does not consume it,
  and joins the lane's paused workers so ``resume`` starts it there too.
- A thread records depth/throughput samples for the dashboard charts every few
  seconds (one process at a time takes a sample, through a short Redis lock).
- ``kill -USR2 <pid>`` writes every thread's stack to the worker's log, in the
  main process and in pool children alike (a hung worker can be diagnosed
  without a debugger).
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading

from celery import bootsteps

from dispatchsite.celery import app
from lanes import keys, metrics

logger = logging.getLogger(__name__)


class StackDumpStep(bootsteps.Step):
    """SIGUSR2 dumps all threads' stacks; prefork children inherit the handler."""

    def __init__(self, worker, **kwargs):
        faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True)


class PausedLanesStep(bootsteps.Step):
    """Deselect paused lanes before the consumer starts."""

    def __init__(self, worker, **kwargs):
        from lanes.redis_client import get_redis

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


class MetricsSamplerStep(bootsteps.StartStopStep):
    """Samples every configured lane's waiting count and completed total for the charts."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, **kwargs):
        self.stopping = threading.Event()

    def start(self, worker) -> None:
        threading.Thread(target=self._loop, name="dispatch-metrics-sampler", daemon=True).start()

    def stop(self, worker) -> None:
        self.stopping.set()

    def _loop(self) -> None:
        from lanes.redis_client import get_redis
        from tasks import config

        while not self.stopping.wait(metrics.SAMPLE_INTERVAL_S):
            try:
                metrics.maybe_sample(get_redis(), list(config.refresh_if_changed().lanes))
            except Exception:  # a missed sample is a gap in a chart, never a worker failure
                logger.warning("metrics_sample_failed", exc_info=True)


app.steps["worker"].add(StackDumpStep)
app.steps["worker"].add(PausedLanesStep)
app.steps["worker"].add(MetricsSamplerStep)
