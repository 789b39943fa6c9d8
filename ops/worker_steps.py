"""The worker bootstep that samples every lane for the dashboard charts (``MetricsSamplerStep``).

Wired in dispatchsite/celery.py (``WORKER_STEPS``, by path): importing this
module registers nothing. One process at a time takes a sample, through a short
Redis lock (``ops.metrics.maybe_sample``), so many workers sample no more often
than one would.
"""

from __future__ import annotations

import logging
import threading

from celery import bootsteps

logger = logging.getLogger(__name__)


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
        from ops import metrics
        from tasks import config

        while not self.stopping.wait(metrics.SAMPLE_INTERVAL_S):
            try:
                metrics.maybe_sample(get_redis(), list(config.refresh_if_changed().lanes))
            except Exception:  # a missed sample is a gap in a chart, never a worker failure
                logger.warning("metrics_sample_failed", exc_info=True)
