from __future__ import annotations

import random

from tasks.retry import Backoff, base_delay_s, decide_retry, delay_bounds_s, retry_delay_s

POLICY = Backoff(max_retries=5, initial_backoff=0.5, multiplier=2.0, max_backoff=4.0, jitter=0.2)


def test_base_delay_is_exponential_and_capped():
    assert [base_delay_s(POLICY, n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_huge_exponent_does_not_overflow():
    assert base_delay_s(Backoff(100, 1.0, 100.0, 30.0, 0.0), 10_000) == 30.0


def test_jitter_stays_within_bounds_and_spreads():
    rng = random.Random(7)
    samples = [retry_delay_s(POLICY, 1, rng) for _ in range(2000)]
    low, high = delay_bounds_s(POLICY, 1)
    assert (low, high) == (0.8, 1.2)
    assert all(low <= s <= high for s in samples)
    assert max(samples) - min(samples) > 0.3  # jitter really varies


def test_zero_jitter_is_exact():
    policy = Backoff(3, 1.0, 3.0, 100.0, 0.0)
    assert [retry_delay_s(policy, n) for n in range(3)] == [1.0, 3.0, 9.0]


def test_decide_retry_exhausts_after_max_retries():
    assert decide_retry(POLICY, 5, 0, 1000).retry
    decision = decide_retry(POLICY, 6, 0, 1000)
    assert not decision.retry and decision.reason == "exhausted"


def test_decide_retry_never_schedules_past_the_deadline():
    decision = decide_retry(POLICY, 3, now_s=100.0, deadline_s=101.0)
    assert not decision.retry and decision.reason == "expired"


def test_retry_after_raises_the_delay():
    decision = decide_retry(POLICY, 1, 0, 1000, retry_after_s=30)
    assert decision.retry and decision.delay_s == 30
