"""Per-token request rate, held across every web process by one Redis counter per second.

A fixed one-second window: ``INCRBY`` and ``EXPIRE`` in one transaction (one
round trip); a request costs 1, a bulk request one per item. A request over the
token's rate is refused with the seconds left in the window; if Redis cannot
answer, the request is let through (admission
itself bounds every lane and answers ``unavailable``).
"""

from __future__ import annotations

import logging
import math
import time

import redis

from lanes import keys
from lanes.redis_client import get_redis

logger = logging.getLogger(__name__)


def rate_key(token_id: int, window: int) -> str:
    return f"{keys.PREFIX}api:rate:{token_id}:{window}"


def retry_after_s(now: float) -> int:
    """Whole seconds until the current one-second window ends (at least 1, as Retry-After wants)."""
    return max(1, math.ceil(math.floor(now) + 1 - now))


def check(token_id: int, rate_per_s: int, now: float | None = None, cost: int = 1) -> int | None:
    """None if ``cost`` more (a request, or a bulk request's items) is within the token's rate, else the
    Retry-After in seconds; a refused cost is given back, so a bulk too big for the window does not hold
    the token's smaller requests back."""
    now = time.time() if now is None else now
    key = rate_key(token_id, int(now))
    try:
        client = get_redis()
        pipe = client.pipeline(transaction=True)
        pipe.incrby(key, cost)
        pipe.expire(key, 2)
        count = pipe.execute()[0]
        if count > rate_per_s:
            client.decrby(key, cost)
    except redis.RedisError as exc:
        logger.warning("api_rate_unchecked token=%s error=%s", token_id, exc)
        return None
    if count > rate_per_s:
        return retry_after_s(now)
    return None
