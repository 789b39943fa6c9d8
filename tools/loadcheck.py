"""Pure verification for the load test: lost, duplicated and out-of-order effects (no Django, no Redis).

The load test knows what it sent (one ``Sent`` per dispatch, accepted or not)
and reads back what the sink applied (its log, in the order Redis received the
writes, and a per-key count). ``check`` turns that into a ``Verdict``;
``step_passed`` says whether a load step holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sent:
    """One dispatch of the load generator."""

    key: str  # idempotency key, unique per message
    chat: str
    seq: int  # position of the message in its chat, increasing in dispatch order
    accepted: bool
    task_id: str | None = None
    reason: str | None = None
    scheduled_ms: float = 0.0  # when the open-loop schedule wanted it sent (epoch ms)
    done_ms: float = 0.0  # when dispatch returned (epoch ms)
    started_ms: float = 0.0  # when the dispatch call began (epoch ms)


@dataclass(frozen=True)
class Applied:
    """One entry of the sink's log: a message whose effect was applied."""

    chat: str
    seq: int
    at_ms: float
    key: str


@dataclass
class Verdict:
    accepted: int = 0
    applied: int = 0  # distinct accepted messages applied at least once
    dead: int = 0  # accepted messages that ended as dead letters (accounted for, not applied)
    lost: int = 0  # accepted, never applied, not a dead letter
    duplicates: int = 0  # extra applications beyond the first, summed over messages
    order_violations: int = 0  # applications that came after a later message of the same chat
    unknown: int = 0  # applied keys this run never sent
    lost_keys: list[str] = field(default_factory=list)
    duplicate_keys: list[str] = field(default_factory=list)
    order_examples: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.duplicates == 0 and self.order_violations == 0 and self.unknown == 0


def parse_log_line(line: str | bytes) -> Applied | None:
    """Parse the sink's ``chat\\tseq\\tms\\tkey`` line; None when it is not one."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    parts = text.split("\t")
    if len(parts) != 4:
        return None
    try:
        return Applied(parts[0], int(parts[1]), float(parts[2]), parts[3])
    except ValueError:
        return None


def check(
    sent: Iterable[Sent],
    log: Sequence[Applied],
    counts: dict[str, int],
    dead_task_ids: Iterable[str] = (),
    examples: int = 5,
) -> Verdict:
    """Account for every accepted message.

    ``counts`` is the sink's key -> times applied; ``log`` its entries in the
    order applied. A message of a chat must be applied after every earlier
    accepted message of that chat that was applied (strict per-chat FIFO).
    """
    verdict = Verdict()
    accepted = {s.key: s for s in sent if s.accepted}
    verdict.accepted = len(accepted)
    dead = set(dead_task_ids)
    for key, s in accepted.items():
        n = counts.get(key, 0)
        if n > 0:
            verdict.applied += 1
            if n > 1:
                verdict.duplicates += n - 1
                if len(verdict.duplicate_keys) < examples:
                    verdict.duplicate_keys.append(key)
        elif s.task_id in dead:
            verdict.dead += 1
        else:
            verdict.lost += 1
            if len(verdict.lost_keys) < examples:
                verdict.lost_keys.append(key)
    verdict.unknown = sum(1 for key in counts if key not in accepted)
    # Per chat, each first application must carry a higher seq than every earlier one.
    seen: set[str] = set()
    highest: dict[str, int] = {}
    for entry in log:
        if entry.key in seen or entry.key not in accepted:
            continue
        seen.add(entry.key)
        top = highest.get(entry.chat)
        if top is not None and entry.seq < top:
            verdict.order_violations += 1
            if len(verdict.order_examples) < examples:
                verdict.order_examples.append(f"chat {entry.chat}: seq {entry.seq} applied after seq {top}")
        else:
            highest[entry.chat] = entry.seq
    return verdict


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float | None]:
    """Nearest-rank percentiles, keyed ``p50`` etc.; None for an empty sample."""
    ordered = sorted(values)
    out: dict[str, float | None] = {}
    for q in qs:
        name = f"p{q:g}"
        if not ordered:
            out[name] = None
            continue
        rank = max(1, math.ceil(q / 100 * len(ordered)))
        out[name] = ordered[min(rank, len(ordered)) - 1]
    return out


def correctness_problems(verdict: Verdict) -> list[str]:
    """Lost, duplicated, reordered or unknown effects, each with its count."""
    return [f"{n} {what}" for n, what in ((verdict.lost, "lost"), (verdict.duplicates, "duplicate effects"),
                                          (verdict.order_violations, "order violations"),
                                          (verdict.unknown, "unknown applications")) if n]


def step_verdict(verdict: Verdict, load: StepLoad) -> tuple[bool, str]:
    """A step passes when every effect is accounted for and it held its rate (:func:`throughput_problems`)."""
    problems = correctness_problems(verdict) + throughput_problems(load)
    return (not problems, "; ".join(problems) or "ok")


def step_passed(verdict: Verdict, drained: bool, drain_s: float | None, drain_limit_s: float) -> tuple[bool, str]:
    """A step passes when nothing is lost, duplicated or reordered and the queue drains in time."""
    problems = []
    if verdict.lost:
        problems.append(f"{verdict.lost} lost")
    if verdict.duplicates:
        problems.append(f"{verdict.duplicates} duplicate effects")
    if verdict.order_violations:
        problems.append(f"{verdict.order_violations} order violations")
    if verdict.unknown:
        problems.append(f"{verdict.unknown} unknown applications")
    if not drained:
        problems.append("did not drain")
    elif drain_s is not None and drain_s > drain_limit_s:
        problems.append(f"drained in {drain_s:.1f}s > {drain_limit_s:g}s")
    return (not problems, "; ".join(problems) or "ok")


# -- the throughput verdict ---------------------------------------------------
#: A step passes only if completions during the step reach this fraction of the offered rate.
MIN_COMPLETION_RATIO = 0.97
#: ... and the backlog when the step ends is under this many seconds of offered load.
MAX_END_BACKLOG_S = 1.0
#: A step's queue depth "grows" when it rises faster than this fraction of the offered rate.
GROWTH_FRACTION = 0.02


@dataclass(frozen=True)
class StepLoad:
    """What a step offered and what the platform did with it, as the verdict needs it."""

    target_per_s: float  # the step's rate
    offered_per_s: float  # what the generator actually sent per second
    completed_during_per_s: float  # distinct messages applied between the step's start and end, per second
    backlog_at_end: int  # accepted but not yet applied when the step ended
    drained: bool
    drain_s: float | None  # seconds after the step's end until every task was terminal
    drain_limit_s: float


def throughput_problems(load: StepLoad) -> list[str]:
    """Why a step did not hold its rate, each with its numbers; empty when it held.

    Draining within the limit after the step is not enough on its own: a step
    whose workers completed 63 % of the offered rate, with a backlog that
    drained in 9 s, did not sustain that rate.
    """
    problems = []
    if load.offered_per_s < MIN_COMPLETION_RATIO * load.target_per_s:
        problems.append(f"generator offered {load.offered_per_s:g}/s < {MIN_COMPLETION_RATIO:.0%} of "
                        f"{load.target_per_s:g}/s (the load generator could not keep the schedule)")
    need = MIN_COMPLETION_RATIO * load.offered_per_s
    if load.completed_during_per_s < need:
        ratio = load.completed_during_per_s / load.offered_per_s if load.offered_per_s else 0.0
        problems.append(f"completed {load.completed_during_per_s:g}/s during the step = {ratio:.0%} of offered "
                        f"{load.offered_per_s:g}/s (needs >= {MIN_COMPLETION_RATIO:.0%})")
    limit = MAX_END_BACKLOG_S * load.offered_per_s
    if load.backlog_at_end >= limit:
        problems.append(f"backlog at the step's end {load.backlog_at_end} >= {limit:g} "
                        f"({MAX_END_BACKLOG_S:g}s of offered load)")
    if not load.drained:
        problems.append("did not drain")
    elif load.drain_s is not None and load.drain_s > load.drain_limit_s:
        problems.append(f"drained in {load.drain_s:.1f}s > {load.drain_limit_s:g}s")
    return problems


def completed_between(log: Sequence[Applied], keys: set[str], start_ms: float, end_ms: float) -> int:
    """Distinct messages of ``keys`` first applied within ``[start_ms, end_ms]``."""
    first: dict[str, float] = {}
    for entry in log:
        if entry.key in keys and entry.key not in first:
            first[entry.key] = entry.at_ms
    return sum(1 for at in first.values() if start_ms <= at <= end_ms)


def depth_slope(samples: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of queue depth over time (tasks/s) from ``(seconds, depth)`` samples; 0 if too few."""
    if len(samples) < 3:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_d = sum(d for _, d in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (d - mean_d) for t, d in samples) / var


def depth_grows(rate: float, samples: Sequence[tuple[float, float]]) -> bool:
    """The queue grows during a step when depth rises faster than :data:`GROWTH_FRACTION` of the rate."""
    return depth_slope(samples) > max(1.0, GROWTH_FRACTION * rate)


def knee(steps: Sequence[tuple[float, Sequence[tuple[float, float]]]]) -> float | None:
    """The lowest step rate at which queue depth starts to grow (``(rate, depth samples)`` per step); None if none."""
    for rate, samples in sorted(steps, key=lambda s: s[0]):
        if depth_grows(rate, samples):
            return rate
    return None


def sustained(results: Sequence[tuple[float, bool]]) -> float | None:
    """The highest step rate that passed; None when none did."""
    passing = [rate for rate, passed in results if passed]
    return max(passing) if passing else None
