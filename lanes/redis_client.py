"""One Redis client per process for the platform's own keys (not the broker's).

The pool is sized for a thread pool worker; redis-py resets it after a fork.
"""

from __future__ import annotations

import threading

import redis
from django.conf import settings

_lock = threading.Lock()
_client: redis.Redis | None = None


def get_redis() -> redis.Redis:
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                _client = redis.Redis.from_url(
                    settings.REDIS_URL,
                    max_connections=256,
                    socket_timeout=10,
                    socket_connect_timeout=5,
                    health_check_interval=30,
                    retry_on_timeout=False,
                )
    return _client


def reset_redis() -> None:
    """Forget the client (tests that point settings at another server)."""
    global _client
    with _lock:
        _client = None
