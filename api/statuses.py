"""The HTTP status of each ``DispatchResult`` (pure; documented in the README).

202 accepted (a duplicate too: ``duplicate`` says so); the input is wrong: 422,
404 for an unknown type, 413 for a payload over the type's limit; the state
refuses it: 409; the platform is full: 429 (retry later); closed or Redis
unreachable: 503.
"""

from __future__ import annotations

ACCEPTED = 202

REJECTION_STATUS: dict[str, int] = {
    "unknown_type": 404,
    "type_disabled": 409,
    "invalid_payload": 422,
    "payload_too_large": 413,
    "invalid_priority": 422,
    "invalid_timeout": 422,
    "invalid_chat_id": 422,
    "invalid_idempotency_key": 422,
    "invalid_dedupe_key": 422,
    "invalid_metadata": 422,
    "invalid_limit_key": 422,
    "invalid_eta": 422,
    "unknown_retry_policy": 422,
    "lane_full": 429,
    "chat_queue_full": 429,
    "caller_quota": 429,
    "lane_closed": 503,
    "idempotency_conflict": 409,
    "unavailable": 503,
    "redis_memory_high": 503,
}

#: Seconds a client waits before retrying a 429 or 503 rejection.
RETRY_AFTER_S = 1


def status_for(accepted: bool, reason: str | None) -> int:
    """HTTP status of one dispatch; a reason added later without a mapping is a 422."""
    if accepted:
        return ACCEPTED
    return REJECTION_STATUS.get(reason or "", 422)
