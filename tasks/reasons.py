"""The closed sets of reasons the platform answers with (documented in the README)."""

from __future__ import annotations

#: Why a dispatch was not accepted (``DispatchResult.reason``).
REJECTION_REASONS = (
    "unknown_type",
    "type_disabled",
    "invalid_payload",
    "payload_too_large",
    "invalid_priority",
    "invalid_timeout",
    "invalid_chat_id",
    "invalid_idempotency_key",
    "invalid_dedupe_key",
    "invalid_metadata",
    "invalid_limit_key",
    "invalid_eta",
    "unknown_retry_policy",
    "lane_full",
    "chat_queue_full",
    "caller_quota",
    "lane_closed",
    "idempotency_conflict",
    "unavailable",
    "redis_memory_high",
)

#: Why a task became a dead letter (``DeadLetter.reason``).
DEAD_REASONS = ("exhausted", "expired", "non_retryable", "poison", "malformed")
