"""``manage.py limitbench``: does a limit deliver what it promises, on a running platform?

Two measurements against the workers of a running platform (``make run``),
each with tasks of the ``loadtest.sink`` handler (its record gives the time
each task was applied):

- **rate**: a global limit of ``rate``/s, demand far above it (every task
  dispatched at once): the applied rate after the burst, as a share of the limit;
- **fair share**: a fair-share key limit with weights, every key flooded at once:
  each key's share of the completions from the moment every task was queued
  until the first key ran out of backlog, against its weight's share.

The limits and types it creates are named ``limitbench-<run>`` and deleted afterwards.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tools.sink import applied_key, log_key

Progress = Callable[[str], None]


# --- pure: the figures from the sink's record ------------------------------------

def steady_rate(applied_at: Sequence[float], burst: int) -> float | None:
    """Tasks/s after the first ``burst`` (which the bucket lets through at once): (n - 1) / span."""
    steady = sorted(applied_at)[burst:]
    if len(steady) < 2 or steady[-1] <= steady[0]:
        return None
    return (len(steady) - 1) / (steady[-1] - steady[0])


def shares(order: Sequence[str], weights: dict[str, int], backlog: dict[str, int]) -> dict[str, dict[str, float]]:
    """Each key's share of the completions while every key still had work, vs its weight's share."""
    left = dict(backlog)
    counted: dict[str, int] = dict.fromkeys(backlog, 0)
    for key in order:
        if key not in left:
            continue
        if any(n == 0 for n in left.values()):
            break
        counted[key] += 1
        left[key] -= 1
    total = sum(counted.values()) or 1
    weight_total = sum(weights.get(k, 1) for k in backlog)
    return {k: {"completions": counted[k], "share": round(counted[k] / total, 4),
                "expected": round(weights.get(k, 1) / weight_total, 4)} for k in sorted(backlog)}


# --- the runs ------------------------------------------------------------------------

@dataclass
class LimitBenchReport:
    lane: str
    rate: dict[str, Any] = field(default_factory=dict)
    fair: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _define(run: str, lane: str, suffix: str, limit_fields: dict[str, Any]) -> tuple[str, str]:
    from lanes.config_version import bump_config_version
    from lanes.models import Lane
    from tasks import config
    from tasks.models import Limit, RetryPolicy, TaskType, TaskTypeLimit

    name = f"limitbench-{run}-{suffix}"
    lim = Limit(name=name, **limit_fields)
    lim.full_clean()
    lim.save()
    policy, _ = RetryPolicy.objects.get_or_create(name="limitbench", defaults={"max_retries": 3})
    tt = TaskType(name=name, handler="loadtest.sink", lane=Lane.objects.get(name=lane), retry_policy=policy,
                  timeout=600, attempt_timeout=30)
    tt.full_clean()
    tt.save()
    TaskTypeLimit.objects.create(task_type=tt, limit=lim, position=0)
    bump_config_version()
    config.forget()
    time.sleep(1.0)  # the workers reload their config at their next task or maintenance pass
    return name, name


def _cleanup(names: list[str]) -> None:
    from lanes.config_version import bump_config_version
    from tasks.models import Limit, TaskType

    TaskType.objects.filter(name__in=names).delete()
    Limit.objects.filter(name__in=names).delete()
    bump_config_version()


def _wait_applied(client: Any, run: str, n: int, timeout: float, progress: Progress) -> list[tuple[str, float]]:
    """(idempotency key, applied at) of the run's tasks once ``n`` were applied (or the timeout passed)."""
    deadline = time.time() + timeout
    last = -1
    while time.time() < deadline:
        done = client.hlen(applied_key(run))
        if done != last:
            progress(f"{run}: {done}/{n} applied")
            last = done
        if done >= n:
            break
        time.sleep(1.0)
    out = []
    for line in client.lrange(log_key(run), 0, -1):
        parts = line.decode().split("\t")
        if len(parts) >= 4:
            out.append((parts[3], int(parts[2]) / 1000))
    return sorted(out, key=lambda x: x[1])


def run_limitbench(*, lane: str, rate: float, burst: int, seconds: float, latency_ms: float,
                   fair_window: int, fair_weights: dict[str, int], fair_per_key: int,
                   progress: Progress = lambda _line: None) -> LimitBenchReport:
    from lanes.redis_client import get_redis
    from tasks.dispatch import admit

    client = get_redis()
    run = uuid.uuid4().hex[:8]
    report = LimitBenchReport(lane=lane)
    made: list[str] = []
    try:
        name, lim = _define(run, lane, "rate", {"scope": "global", "rate": rate, "burst": burst})
        made.append(name)
        n = int(rate * seconds) + burst
        rrun = f"limitbench-{run}-rate"
        t0 = time.time()
        refused = sum(1 for i in range(n) if not admit(
            name, {"run": rrun, "latency_ms": latency_ms, "seq": i}, idempotency_key=f"{rrun}:{i}").accepted)
        sent_s = time.time() - t0
        applied = _wait_applied(client, rrun, n - refused, seconds * 3 + 60, progress)
        measured = steady_rate([t for _, t in applied], burst)
        report.rate = {"limit": lim, "rate": rate, "burst": burst, "tasks": n, "refused": refused,
                       "dispatched_in_s": round(sent_s, 2), "applied": len(applied),
                       "applied_per_s": round(measured, 2) if measured else None,
                       "share_of_limit": round(measured / rate, 4) if measured else None}

        name, lim = _define(run, lane, "fair", {"scope": "key", "fair_share": True, "window": fair_window,
                                                "weights": fair_weights})
        made.append(name)
        frun = f"limitbench-{run}-fair"
        keys_ = sorted(set(fair_weights) | {"plain"})
        # A plug fills the window first (slow tasks of their own key), so the flood queues behind it
        # whole and the weights divide all of it, not the order it was dispatched in.
        plug_ms = 8000.0
        for i in range(fair_window):
            admit(name, {"run": frun, "latency_ms": plug_ms, "seq": i}, limit_key="plug",
                  idempotency_key=f"{frun}:plug:{i}")
        for i in range(fair_per_key):
            for k in keys_:
                admit(name, {"run": frun, "latency_ms": latency_ms, "seq": i}, limit_key=k,
                      idempotency_key=f"{frun}:{k}:{i}")
        queued_at = time.time()
        total = fair_per_key * len(keys_) + fair_window
        applied = _wait_applied(client, frun, total, total / max(1.0, fair_window) + 120, progress)
        applied = [(key, t) for key, t in applied if key.split(":")[1] != "plug"]
        # Anything applied before the whole flood was queued (the plug was too short) is left out.
        before = [key.split(":")[1] for key, t in applied if t < queued_at]
        after = [key.split(":")[1] for key, t in applied if t >= queued_at]
        backlog = {k: fair_per_key - before.count(k) for k in keys_}
        report.fair = {"limit": lim, "window": fair_window, "weights": fair_weights, "per_key": fair_per_key,
                       "applied": len(applied), "applied_while_dispatching": len(before),
                       "backlog_when_queued": backlog, "shares": shares(after, fair_weights, backlog)}
    finally:
        _cleanup(made)
    return report
