"""Lane controls (close, open, pause, resume, drain) for the admin, the dashboard and ``manage.py lanes``.

- close / open: the Lane's ``accepting`` flag; saving it bumps the config
  version, so the next dispatch anywhere answers ``lane_closed``.
- pause / resume: Celery remote control (cancel / add consumer) on the workers
  that consume the lane. The paused flag lives in Redis so the dashboard shows
  it and a worker started during a pause skips the lane too (lanes.worker).
- drain: close, then wait until nothing of the lane waits or runs.

Every change is logged as a LaneEvent with who did it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from celery import Celery, current_app
from django.conf import settings

from lanes import consumers, keys
from lanes.models import Lane, LaneEvent
from lanes.redis_client import get_redis
from ops import metrics

ACTIONS = ("close", "open", "pause", "resume", "drain")
#: Seconds to wait for workers' replies to a remote-control broadcast.
CONTROL_TIMEOUT_S = 2.0


class ControlError(Exception):
    """The control could not be applied; the message says why."""


@dataclass
class Outcome:
    lane: str
    action: str
    message: str
    workers: list[str] = field(default_factory=list)


def _lane(name: str) -> Lane:
    try:
        return Lane.objects.get(name=name)
    except Lane.DoesNotExist:
        raise ControlError(f"no lane named {name!r}") from None


def log(lane: str, action: str, actor: str, detail: str = "") -> None:
    LaneEvent.objects.create(lane=lane, action=action, actor=actor[:150], detail=detail)


def set_accepting(name: str, accepting: bool, actor: str, action: str | None = None) -> Outcome:
    lane = _lane(name)
    action = action or ("open" if accepting else "close")
    if lane.accepting != accepting:
        lane.accepting = accepting
        lane.save(update_fields=["accepting"])  # bumps the config version on commit
    if accepting:
        get_redis().srem(keys.DRAINING_LANES, name)
    message = f"lane {name} {'accepts' if accepting else 'refuses'} new tasks"
    log(name, action, actor, message)
    return Outcome(name, action, message)


def close(name: str, actor: str) -> Outcome:
    return set_accepting(name, False, actor)


def open_lane(name: str, actor: str) -> Outcome:
    return set_accepting(name, True, actor)


def _app() -> Celery:
    """The platform's Celery app, without importing the project module (ops sits below dispatchsite)."""
    return current_app._get_current_object()


def consuming_workers(lane: str, timeout: float = CONTROL_TIMEOUT_S) -> list[str]:
    """Names of the workers that consume ``lane`` now (they answer within ``timeout``).

    A broadcast does not know who will answer, so it used to wait out its whole ``timeout``: each
    pause in the admin cost 2 s. The live workers are known from their heartbeats (every worker
    beats before it says it is ready, ``lanes.worker.HeartbeatStep``), so the broadcast stops once
    as many replies as live workers came; one of those it missed (a reply of a worker without a
    heartbeat took its place) is asked by name. With no heartbeat at all, or a live worker silent
    (killed, its beat not yet expired), it waits the whole ``timeout`` as before.
    """
    live = {beat.hostname for beat in consumers.read_workers(get_redis(), time.time())}
    replies = _active_queues(timeout, limit=len(live) or None)
    missing = sorted(live - set(replies))
    if missing and len(replies) >= len(live):
        replies.update(_active_queues(timeout, limit=len(missing), destination=missing))
    return sorted(worker for worker, queues in replies.items() if any(q.get("name") == lane for q in queues or []))


def _active_queues(timeout: float, limit: int | None, destination: list[str] | None = None) -> dict[str, list]:
    """``inspect().active_queues()`` that returns after ``limit`` replies (or ``timeout`` without one)."""
    return _app().control.inspect(timeout=timeout, limit=limit, destination=destination).active_queues() or {}


def pause(name: str, actor: str, timeout: float = CONTROL_TIMEOUT_S) -> Outcome:
    """Stop every worker consuming ``name``; returns once none of them lists it any more."""
    _lane(name)
    client = get_redis()
    # The flag first: a worker starting from now on skips the lane by itself.
    client.sadd(keys.PAUSED_LANES, name)
    workers = consuming_workers(name, timeout)
    if workers:
        client.sadd(keys.paused_workers(name), *workers)
        _app().control.cancel_consumer(name, destination=workers, reply=True, timeout=timeout, limit=len(workers))
        _wait_not_consuming(name, workers, timeout * 5)
    held = sorted(m.decode() for m in client.smembers(keys.paused_workers(name)))
    message = f"lane {name} paused on {len(held)} worker(s): {', '.join(held) or 'none running'}"
    log(name, "pause", actor, message)
    return Outcome(name, "pause", message, held)


def _wait_not_consuming(name: str, workers: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replies = _app().control.inspect(destination=workers, timeout=CONTROL_TIMEOUT_S,
                                         limit=len(workers)).active_queues() or {}
        if not any(q.get("name") == name for queues in replies.values() for q in queues or []):
            return
        time.sleep(0.2)
    raise ControlError(f"workers still consume {name} after {timeout:.0f}s; try again")


def resume(name: str, actor: str, timeout: float = CONTROL_TIMEOUT_S) -> Outcome:
    """Restart consumption on the workers the pause stopped (and those that skipped it at start)."""
    _lane(name)
    client = get_redis()
    workers = sorted(m.decode() for m in client.smembers(keys.paused_workers(name)))
    client.srem(keys.PAUSED_LANES, name)
    if workers:
        _app().control.add_consumer(name, destination=workers, reply=True, timeout=timeout, limit=len(workers))
    client.delete(keys.paused_workers(name))
    message = f"lane {name} resumed on {len(workers)} worker(s): {', '.join(workers) or 'none'}"
    log(name, "resume", actor, message)
    return Outcome(name, "resume", message, workers)


def remaining(name: str) -> metrics.LaneGauges:
    """What a drain still waits for: depth, scheduled retries, chat backlog and running tasks."""
    return metrics.read_gauges(get_redis(), [name], time.time(), settings.DISPATCH_LEASE_S)[name]


def start_drain(name: str, actor: str) -> Outcome:
    """Close admission and mark the lane draining (the dashboard shows what is left)."""
    set_accepting(name, False, actor, action="drain")
    get_redis().sadd(keys.DRAINING_LANES, name)
    left = remaining(name)
    return Outcome(name, "drain", f"lane {name} closed and draining: {left.remaining} task(s) left")


def drain(name: str, actor: str, timeout: float | None = None, interval: float = 1.0,
          progress: Callable[[metrics.LaneGauges], None] | None = None) -> Outcome:
    """Close the lane and wait until it is empty; ``progress`` is called at each check.

    The lane stays closed afterwards: open it again when it should take work.
    """
    start_drain(name, actor)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = remaining(name)
        if progress is not None:
            progress(left)
        if left.remaining == 0:
            log(name, "drained", actor, f"lane {name} is empty")
            return Outcome(name, "drain", f"lane {name} drained (it stays closed until opened)")
        if deadline is not None and time.monotonic() >= deadline:
            raise ControlError(f"lane {name} still holds {left.remaining} task(s) after {timeout:.0f}s "
                               "(it stays closed and draining)")
        time.sleep(interval)


def apply(action: str, name: str, actor: str) -> Outcome:
    """One control by name, without waiting for a drain to finish (for the web pages)."""
    if action == "close":
        return close(name, actor)
    if action == "open":
        return open_lane(name, actor)
    if action == "pause":
        return pause(name, actor)
    if action == "resume":
        return resume(name, actor)
    if action == "drain":
        return start_drain(name, actor)
    raise ControlError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
