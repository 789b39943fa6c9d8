"""The Hypothesis settings the property tests share: bounded, no deadline, and fixed in CI.

``CI`` set (any value): ``derandomize=True``, so a CI run tries the same examples every
time and a failure reproduces. ``HYPOTHESIS_MAX_EXAMPLES`` scales every test's budget
(e.g. ``HYPOTHESIS_MAX_EXAMPLES=2000`` for a long local hunt). No example database:
nothing is written into the checkout; regressions are kept as explicit ``@example``\\s.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = "dispatch"

settings.register_profile(
    PROFILE,
    deadline=None,  # real Redis and databases on a shared machine: time per example varies
    derandomize=bool(os.environ.get("CI")),
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def bounded(max_examples: int) -> settings:
    """The shared profile with ``max_examples`` (or ``HYPOTHESIS_MAX_EXAMPLES`` when set)."""
    override = os.environ.get("HYPOTHESIS_MAX_EXAMPLES")
    return settings(settings.get_profile(PROFILE), max_examples=int(override) if override else max_examples)
