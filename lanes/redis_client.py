"""One Redis client per process for the platform's own keys (not the broker's).

The pool is sized for a thread pool worker; redis-py resets it after a fork.
Every call answers or fails within ``DISPATCH_REDIS_TIMEOUT_S`` and is never
re-sent by redis-py: a frozen Redis makes ``dispatch`` answer ``unavailable``
in bounded time (the fault campaign found it waiting 10 s per call), and a Lua
script that timed out may have run, so sending it again could run it twice.
"""

from __future__ import annotations

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from lanes.forksafe import ForkSafeLock

_lock = ForkSafeLock()
_client: redis.Redis | None = None


def get_redis() -> redis.Redis:
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                timeout = settings.DISPATCH_REDIS_TIMEOUT_S
                _client = redis.Redis.from_url(
                    settings.REDIS_URL,
                    max_connections=256,
                    socket_timeout=timeout,
                    socket_connect_timeout=timeout,
                    health_check_interval=30,
                    retry=Retry(NoBackoff(), 0),
                )
    return _client


def reset_redis() -> None:
    """Forget the client (tests that point settings at another server)."""
    global _client
    with _lock:
        _client = None
