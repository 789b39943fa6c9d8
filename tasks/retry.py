"""Backoff arithmetic for retries: pure functions, no Django, Redis or Celery."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: Longest timeout (whole life or one attempt) a task type may ask for, in seconds.
MAX_TIMEOUT_S = 7 * 86400.0


@dataclass(frozen=True)
class Backoff:
    max_retries: int
    initial_backoff: float
    multiplier: float
    max_backoff: float
    jitter: float


def base_delay_s(policy: Backoff, retry_number: int) -> float:
    """Delay before retry ``retry_number`` (0 for the first retry), before jitter."""
    exponent = max(0, retry_number)
    try:
        raw = policy.initial_backoff * (policy.multiplier ** exponent)
    except OverflowError:
        raw = float("inf")
    return min(policy.max_backoff, raw)


def delay_bounds_s(policy: Backoff, retry_number: int) -> tuple[float, float]:
    base = base_delay_s(policy, retry_number)
    spread = base * policy.jitter
    return max(0.0, base - spread), base + spread


def retry_delay_s(policy: Backoff, retry_number: int, rng: random.Random | None = None) -> float:
    """Delay before retry ``retry_number``: the capped exponential plus or minus jitter."""
    low, high = delay_bounds_s(policy, retry_number)
    return (rng or random).uniform(low, high)


@dataclass(frozen=True)
class RetryDecision:
    """What to do after a failed attempt: retry after ``delay_s``, or die with ``reason``."""

    retry: bool
    delay_s: float = 0.0
    reason: str = ""


def decide_retry(
    policy: Backoff,
    attempt: int,
    now_s: float,
    deadline_s: float,
    retry_after_s: float | None = None,
    rng: random.Random | None = None,
) -> RetryDecision:
    """Decide the fate of failed attempt number ``attempt`` (1 for the first)."""
    if attempt > policy.max_retries:
        return RetryDecision(False, reason="exhausted")
    delay = retry_delay_s(policy, attempt - 1, rng)
    if retry_after_s is not None and retry_after_s >= 0:
        delay = max(delay, retry_after_s)
    if now_s + delay >= deadline_s:
        return RetryDecision(False, reason="expired")
    return RetryDecision(True, delay_s=delay)
