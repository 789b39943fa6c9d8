"""One Redis client per process for the platform's own keys (not the broker's).

The pool is sized for a thread pool worker; redis-py resets it after a fork.
Every call answers or fails within ``DISPATCH_REDIS_TIMEOUT_S`` and is never
re-sent by redis-py: a frozen Redis makes ``dispatch`` answer ``unavailable``
in bounded time (the fault campaign found it waiting 10 s per call), and a Lua
script that timed out may have run, so sending it again could run it twice.

``REDIS_URL`` may name Redis Sentinels instead of a server
(``sentinel://:PASSWORD@host:26379;sentinel://host:26380/0``, the form kombu's
Sentinel transport reads; the master's name is ``DISPATCH_SENTINEL_MASTER``).
The client then asks the Sentinels where the master is before each new
connection: after a failover, a call on a connection to the old master fails
(``dispatch`` answers ``unavailable``), and the next one reaches the new master.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.connection import SENTINEL
from redis.retry import Retry
from redis.sentinel import Sentinel

from lanes.forksafe import ForkSafeLock

_lock = ForkSafeLock()
_client: redis.Redis | None = None
_sentinel: Sentinel | None = None

#: Port of a Sentinel named without one (Redis' own default).
SENTINEL_DEFAULT_PORT = 26379


@dataclass(frozen=True)
class SentinelTarget:
    """Where the Sentinels are, and what the master asks for (parsed from ``REDIS_URL``)."""

    sentinels: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    password: str | None


def is_sentinel_url(url: str) -> bool:
    return url.strip().lower().startswith("sentinel://")


def parse_sentinel_url(url: str, default_password: str | None = None) -> SentinelTarget:
    """``sentinel://[:pw@]host[:port][;sentinel://host[:port]...][/db]`` -> ``SentinelTarget``.

    Read as kombu reads it for the broker: credentials and database come from
    the first part; a later part naming another database or the only password
    is refused rather than read differently by the two clients.
    ``default_password`` (``REDIS_PASSWORD``) serves when the URL has none.
    """
    sentinels: list[tuple[str, int]] = []
    db: int | None = None
    username = password = None
    for index, part in enumerate(p.strip() for p in url.split(";")):
        if not part:
            continue
        parsed = urlsplit(part)
        shown = part.split("@")[-1]
        if parsed.scheme.lower() != "sentinel" or not parsed.hostname:
            raise ValueError(f"REDIS_URL part {shown!r} is not sentinel://host:port")
        sentinels.append((parsed.hostname, parsed.port or SENTINEL_DEFAULT_PORT))
        path = parsed.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"REDIS_URL part {shown!r} names database {path!r}: expected a number")
        if index == 0:
            db = int(path) if path else None
            password = unquote(parsed.password) if parsed.password is not None else None
            username = unquote(parsed.username) if parsed.username else None
        else:
            if path and int(path) != (db or 0):
                raise ValueError(f"REDIS_URL part {shown!r} names database {path}, the first part "
                                 f"{db or 0}: name it on the first part (the broker reads only that one)")
            if parsed.password is not None and password is None:
                raise ValueError("REDIS_URL gives a password on a later part only: give it on the first")
    if not sentinels:
        raise ValueError("REDIS_URL names no Sentinel")
    return SentinelTarget(tuple(sentinels), db or 0, username, password if password is not None else default_password)


_local = threading.local()


class deadline:
    """Every Redis wait of this thread inside the block ends ``seconds`` from now at the latest.

    The socket timeouts bound each wait alone: a dispatch that connects, authenticates,
    reads ``INFO`` and then runs its script met up to five of them in a row while a
    frozen Redis filled its listen backlog (the fault campaign saw one wait the whole
    10 s freeze). Under a deadline each wait gets what is left of the call's own time.
    A class, not a ``contextlib`` generator: entered once a dispatch, that was three Python
    calls more each time.
    """

    __slots__ = ("_outer", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    def __enter__(self) -> None:
        outer = self._outer = getattr(_local, "at", None)
        at = time.monotonic() + self._seconds
        _local.at = at if outer is None or at < outer else outer

    def __exit__(self, *exc_info: object) -> None:
        _local.at = self._outer


def time_left() -> float | None:
    """Seconds left before this thread's ``deadline``, or None outside one."""
    at = getattr(_local, "at", None)
    return None if at is None else at - time.monotonic()


class DeadlineConnection(redis.Connection):
    """A connection whose connect and reads end by the calling thread's ``deadline``."""

    def _connect(self) -> socket.socket:
        left = time_left()
        if left is None:
            return super()._connect()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")  # socket.timeout: redis-py says "Timeout connecting"
        configured = self.socket_connect_timeout
        self.socket_connect_timeout = left if configured is None else min(configured, left)
        try:
            return super()._connect()
        finally:
            self.socket_connect_timeout = configured

    def read_response(self, disable_decoding: bool = False, *, timeout: Any = SENTINEL, **options: Any) -> Any:
        left = time_left()
        if left is not None:
            if left <= 0:  # a reply is due: the connection is out of step once we stop waiting for it
                self.disconnect()
                raise redis.TimeoutError(f"Timeout reading from {self._host_error()}: the call's deadline passed")
            wanted = self.socket_timeout if timeout is SENTINEL else timeout
            if wanted is None or wanted > left:
                timeout = left
        return super().read_response(disable_decoding, timeout=timeout, **options)


def _connection_options() -> dict[str, Any]:
    timeout = settings.DISPATCH_REDIS_TIMEOUT_S
    return {"max_connections": 256, "socket_timeout": timeout, "socket_connect_timeout": timeout,
            "health_check_interval": 30, "retry": Retry(NoBackoff(), 0)}


def _sentinel_client() -> redis.Redis:
    global _sentinel
    target = parse_sentinel_url(settings.REDIS_URL, settings.REDIS_PASSWORD or None)
    timeout = settings.DISPATCH_REDIS_TIMEOUT_S
    _sentinel = Sentinel(
        list(target.sentinels),
        sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout,
                         "password": settings.DISPATCH_SENTINEL_PASSWORD or None},
    )
    return _sentinel.master_for(
        settings.DISPATCH_SENTINEL_MASTER, redis_class=redis.Redis, db=target.db,
        username=target.username, password=target.password, **_connection_options(),
    )


def get_redis() -> redis.Redis:
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                if is_sentinel_url(settings.REDIS_URL):
                    _client = _sentinel_client()
                else:
                    _client = redis.Redis.from_url(settings.REDIS_URL, connection_class=DeadlineConnection,
                                                   **_connection_options())
    return _client


def get_sentinel() -> Sentinel | None:
    """The Sentinel set the client follows, or None when ``REDIS_URL`` names a server."""
    get_redis()
    return _sentinel


def reset_redis() -> None:
    """Forget the client (tests that point settings at another server)."""
    global _client, _sentinel
    with _lock:
        _client = None
        _sentinel = None


def redis_topology() -> dict[str, Any]:
    """Which Redis the platform writes to now, and how many failovers its Sentinels have made.

    ``master`` is ``host:port``; ``failovers`` is the Sentinels' configuration
    epoch for the master (0 at start, +1 per election: a failover whose first
    vote split counts 2; 0 without Sentinel);
    ``replicas`` the master's connected replicas (``INFO replication``).
    """
    client = get_redis()
    pool = client.connection_pool
    sentinel = get_sentinel()
    failovers = 0
    if sentinel is not None:
        host, port = pool.get_master_address()  # type: ignore[attr-defined]  # a SentinelConnectionPool
        for node in sentinel.sentinels:
            try:
                failovers = int(node.sentinel_master(settings.DISPATCH_SENTINEL_MASTER)["config-epoch"])
                break
            except (redis.RedisError, KeyError):
                continue
    else:
        host, port = pool.connection_kwargs.get("host", ""), pool.connection_kwargs.get("port", 0)
    replication = client.info("replication")
    return {"master": f"{host}:{port}", "sentinel": sentinel is not None, "failovers": failovers,
            "role": replication.get("role", ""), "replicas": int(replication.get("connected_slaves", 0))}


def _after_fork_in_child() -> None:
    # redis-py resets an inherited pool on its first use, under the pool's own
    # lock: if a thread of the parent (lease renewals, liveness beats,
    # maintenance) held that lock at the fork, the child waited on it for ever,
    # its first task stuck in its claim until the soft time limit (found by the
    # liveness fault scenario L2). The child starts with a client of its own.
    # The inherited one is kept, never collected: closing it would take that
    # same lock.
    global _client, _sentinel
    if _client is not None:
        _inherited.append(_client)
    _client = None
    _sentinel = None


#: Clients inherited through a fork, kept so that they are never closed in the child.
_inherited: list[redis.Redis] = []


os.register_at_fork(after_in_child=_after_fork_in_child)
