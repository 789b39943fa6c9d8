"""Which worker consumes which lane, from the workers' own heartbeats.

Every worker's main process writes a heartbeat every ``HEARTBEAT_INTERVAL_S``
(``lanes.worker``): a JSON key of its own (queues, pid, host, started) and its
hostname in one sorted set per queue it holds, scored by the time the beat
expires. A lane with no live member has no consumer: a task admitted to it
would wait for ever. Admission reads that set inside its Lua call (no extra
round trip), and the dashboard, ``manage.py lanes``, ``/metrics`` and the Lane
changelist read them with one pipelined call.

A worker *holds* a lane when it consumes it now, or when it stopped only because
the lane is paused (it is in the lane's paused-workers set, so ``resume`` starts
it again): such a lane has a consumer, and its status says ``paused``.

A catch-all worker (``DISPATCH_CATCH_ALL=1``) consumes every configured lane
that no other live worker holds; ``unclaimed`` and ``to_release`` decide which.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from lanes import keys

if TYPE_CHECKING:
    from redis import Redis

#: Seconds between two heartbeats of a worker.
HEARTBEAT_INTERVAL_S = 2.0
#: Seconds a heartbeat stays valid without renewal: a killed worker stops
#: counting as a lane's consumer within this.
HEARTBEAT_TTL_S = 10.0
#: Seconds a catch-all worker waits after its start before adopting lanes, so
#: that dedicated workers started with it are seen first.
ADOPT_GRACE_S = 2 * HEARTBEAT_INTERVAL_S


@dataclass
class Heartbeat:
    """What a worker says about itself each beat."""

    hostname: str
    pid: int
    host: str
    started: float
    queues: list[str] = field(default_factory=list)  # consumed now
    paused: list[str] = field(default_factory=list)  # held, stopped by a pause (resume restarts them here)
    catch_all: bool = False
    adopted: list[str] = field(default_factory=list)  # lanes a catch-all worker took on by itself
    #: Threads busy in a handler past its attempt's limit (abandoned: tasks.grouping); its lost capacity.
    stuck: int = 0

    @property
    def held(self) -> list[str]:
        return sorted(set(self.queues) | set(self.paused))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


# --- pure decisions ------------------------------------------------------------

def unclaimed(configured: Iterable[str], holders: Mapping[str, Iterable[str]], mine: Iterable[str]) -> list[str]:
    """Configured lanes that no live worker holds, and that are not among ``mine`` (held here already)."""
    held_here = set(mine)
    return sorted(lane for lane in configured if lane not in held_here and not set(holders.get(lane, ())))


def to_release(adopted: Iterable[str], configured: Iterable[str], holders: Mapping[str, Iterable[str]],
               catch_all_workers: Iterable[str], me: str) -> list[str]:
    """Adopted lanes to give up: removed from the configuration, or now held by a dedicated worker."""
    wanted, others = set(configured), set(catch_all_workers) | {me}
    return sorted(lane for lane in adopted
                  if lane not in wanted or set(holders.get(lane, ())) - others)


def state(consumers: int, paused: bool) -> str:
    """What the operator's views show for a lane: ``no worker``, ``paused`` or ``consuming``."""
    if consumers == 0:
        return "no worker"
    return "paused" if paused else "consuming"


@functools.lru_cache(maxsize=256)
def no_consumer_detail(lane: str) -> str:
    """The ``detail`` of an accepted dispatch to a lane nobody consumes (each of a bulk dispatch's items)."""
    return (f"accepted, but no worker consumes lane '{lane}' right now: the task waits until one does "
            f"(start `celery -A dispatchsite worker -Q {lane}`, or a catch-all worker)")


# --- Redis -----------------------------------------------------------------------

def write_heartbeat(client: Redis, beat: Heartbeat, dropped: Iterable[str], now: float,
                    ttl_s: float = HEARTBEAT_TTL_S) -> None:
    """One pipelined round trip: the worker's key, the live-workers set, and each held queue's set."""
    expiry_ms = int((now + ttl_s) * 1000)
    now_ms = int(now * 1000)
    ttl_ms = int(ttl_s * 1000)
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.worker_heartbeat(beat.hostname), beat.to_json(), px=ttl_ms)
    pipe.zadd(keys.WORKERS, {beat.hostname: expiry_ms})
    pipe.zremrangebyscore(keys.WORKERS, "-inf", now_ms)
    for queue in beat.held:
        key = keys.lane_consumers(queue)
        pipe.zadd(key, {beat.hostname: expiry_ms})
        pipe.zremrangebyscore(key, "-inf", now_ms)
        pipe.pexpire(key, ttl_ms)
    for queue in dropped:
        pipe.zrem(keys.lane_consumers(queue), beat.hostname)
    pipe.execute()


def clear_heartbeat(client: Redis, hostname: str, queues: Iterable[str]) -> None:
    """A worker shutting down stops counting at once (a killed one, when its beat expires)."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(keys.worker_heartbeat(hostname))
    pipe.zrem(keys.WORKERS, hostname)
    for queue in queues:
        pipe.zrem(keys.lane_consumers(queue), hostname)
    pipe.execute()


def held_paused(client: Redis, hostname: str) -> list[str]:
    """Paused lanes this worker stopped consuming and will resume (it is in their paused-workers set)."""
    paused = sorted(m.decode() if isinstance(m, bytes) else m for m in client.smembers(keys.PAUSED_LANES))
    if not paused:
        return []
    pipe = client.pipeline(transaction=False)
    for lane in paused:
        pipe.sismember(keys.paused_workers(lane), hostname)
    return [lane for lane, member in zip(paused, pipe.execute(), strict=True) if member]


def read_holders(client: Redis, lanes: Iterable[str], now: float) -> dict[str, list[str]]:
    """Live workers holding each lane (one pipelined round trip)."""
    names = list(lanes)
    if not names:
        return {}
    now_ms = int(now * 1000)
    pipe = client.pipeline(transaction=False)
    for lane in names:
        pipe.zrangebyscore(keys.lane_consumers(lane), now_ms, "+inf")
    return {lane: sorted(m.decode() if isinstance(m, bytes) else m for m in members)
            for lane, members in zip(names, pipe.execute(), strict=True)}


def read_workers(client: Redis, now: float) -> list[Heartbeat]:
    """Every live worker's last heartbeat."""
    names = client.zrangebyscore(keys.WORKERS, int(now * 1000), "+inf")
    if not names:
        return []
    raw = client.mget([keys.worker_heartbeat(n.decode() if isinstance(n, bytes) else str(n)) for n in names])
    beats = []
    for value in raw:
        if not value:
            continue
        try:
            beats.append(Heartbeat(**json.loads(value)))
        except (TypeError, ValueError):
            continue
    return beats
