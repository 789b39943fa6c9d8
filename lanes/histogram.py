"""Fixed latency buckets shared by the Lua counters and the Prometheus export (pure)."""

from __future__ import annotations

import bisect

#: Upper bounds of the latency buckets, in seconds (Prometheus ``le``).
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
INF = "+Inf"


def bucket_label(seconds: float) -> str:
    """The label of the smallest bucket holding ``seconds``."""
    i = bisect.bisect_left(BUCKETS_S, max(0.0, seconds))
    return INF if i == len(BUCKETS_S) else repr(BUCKETS_S[i])


def labels() -> list[str]:
    return [repr(b) for b in BUCKETS_S] + [INF]


def quantile(counts: dict[str, int], q: float) -> float | None:
    """Estimate a quantile from per-bucket (non-cumulative) counts, as Prometheus does."""
    total = sum(counts.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    lower = 0.0
    for label in labels():
        upper = float("inf") if label == INF else float(label)
        n = counts.get(label, 0)
        if seen + n >= rank and n > 0:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
        if upper != float("inf"):
            lower = upper
    return lower
