"""Background upkeep: move due retries onto lanes, recover expired leases, purge old rows.

Each worker runs it in a thread (retries are promoted within a fraction of a
second); beat also runs it as a Celery task, so it happens even while no worker
of a lane is up. Every step is one idempotent Lua call, safe to run anywhere.
"""

from __future__ import annotations

import logging
import threading
import time

from celery import bootsteps
from django.conf import settings

from dispatchsite.celery import app
from lanes import keys
from lanes.scripts import script
from tasks import config

logger = logging.getLogger(__name__)
BATCH = 500
#: kombu's Redis hash of reserved (delivered, unacknowledged) messages, by delivery tag.
BROKER_UNACKED_KEY = "unacked"
#: How many entries of a lane list the sweep searches (from the consuming end) for a queued copy.
SWEEP_SEARCH_DEPTH = 1000


def promote_due(lanes: list[str] | None = None) -> int:
    """Publish due retries of ``lanes`` (all configured lanes by default)."""
    names = lanes if lanes is not None else list(config.refresh_if_changed().lanes)
    now_ms = int(time.time() * 1000)
    lease_ms = int(settings.DISPATCH_QUEUED_LEASE_S * 1000)
    moved = 0
    for lane in names:
        moved += int(script("promote")(keys=[keys.lane_delayed(lane), keys.LEASES], args=[now_ms, BATCH, lease_ms]))
    return moved


def sweep() -> tuple[int, int]:
    """Republish tasks whose lease expired; returns (republished, forgotten)."""
    republished, forgotten, _waiting = script("sweep")(
        keys=[keys.LEASES],
        args=[int(time.time() * 1000), BATCH, int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
              keys.lane_delayed(""), BROKER_UNACKED_KEY, SWEEP_SEARCH_DEPTH],
    )
    if republished:
        logger.warning("sweep_republished count=%d", republished)
    return int(republished), int(forgotten)


def audit_chats(batch: int = 200) -> list[int]:
    """Check a batch of active chats for a head that cannot move; see audit.lua."""
    result = [int(n) for n in script("audit")(
        keys=[keys.chat_index(), keys.LEASES, keys.CHAT_AUDIT_CURSOR],
        args=[int(time.time() * 1000), batch, int(settings.DISPATCH_QUEUED_LEASE_S * 1000),
              keys.PREFIX + "chat:", keys.lane_chat_waiting("")],
    )]
    if any(result[1:]):
        logger.warning("chat_audit_repaired checked=%d handed_over=%d republished=%d dropped=%d", *result)
    return result


@app.task(name="tasks.maintenance", ignore_result=True)
def maintenance() -> dict:
    return {"promoted": promote_due(), "swept": sweep(), "audited": audit_chats()}


@app.task(name="tasks.purge_dead_letters", ignore_result=True)
def purge_dead_letters() -> int:
    from tasks.dead_letters import purge_resolved

    return purge_resolved()


class MaintenanceStep(bootsteps.StartStopStep):
    """A worker thread that promotes due retries and sweeps expired leases."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, **kwargs):
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, worker) -> None:
        self.thread = threading.Thread(target=self._loop, name="dispatch-maintenance", daemon=True)
        self.thread.start()

    def stop(self, worker) -> None:
        self.stopping.set()

    def _loop(self) -> None:
        interval = settings.DISPATCH_PROMOTE_INTERVAL_S
        sweep_every = max(1.0, min(settings.DISPATCH_LEASE_S, settings.DISPATCH_QUEUED_LEASE_S) / 4)
        next_sweep = 0.0
        while not self.stopping.wait(interval):
            try:
                promote_due()
                if time.monotonic() >= next_sweep:
                    sweep()
                    audit_chats()
                    next_sweep = time.monotonic() + sweep_every
            except Exception:
                logger.warning("maintenance_failed", exc_info=True)
                self.stopping.wait(1.0)


app.steps["worker"].add(MaintenanceStep)
