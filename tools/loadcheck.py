"""The one checker of the load test and the fault campaign, Jepsen-style: what was offered against what happened.

Pure: no Django, Redis or Celery import. ``check`` is given three histories
and returns a ``Report``:

- **ops** (the load generator's history, ``tools/loadgen.py``): one ``Op`` per
  logical message (chat, seq), with the final answer of dispatch: accepted,
  rejected, or unknown (every call failed with ``unavailable`` and at least one
  may have stored it).
- **deliveries**: every attempt that reached the sink, with its idempotency
  key, task id, chat, seq, status and when it started and ended. The fault
  campaign's HTTP sink records each POST; the load test's Lua sink
  (``tools/sink.py``) records applications only, and :func:`check_applied`
  turns its log and counts into deliveries.
- **dead** (the dead-letter table): task id -> reason.

Measures:

- ``lost``: accepted, never applied (2xx at the sink) and never dead-lettered.
- ``unexpected``: reached the sink but was never accepted (a rejected or
  never-offered message ran: a half-written admission).
- ``duplicate_effects``: effects a sink that dedupes on the idempotency key
  would still apply twice: one logical message applied under two keys or by two
  tasks (admission let it in twice). Must be 0. With ``repeat_is_duplicate``
  (the load test's sink does not dedupe) every extra application of an
  accepted key counts too.
- ``redeliveries``: attempts beyond the first per key (allowed: at-least-once).
- ``concurrent_same_key``: successful attempts of one key in flight at the same
  time at the sink. After a worker is killed mid-request, the receiver may still
  be working on the dead worker's request when the redelivery arrives: allowed
  (a redelivery; receivers must dedupe atomically). Where no process is killed
  it would mean two live executions of one task: scenarios assert 0 there.
- ``order_violations``: per chat, a message first applied after a later
  accepted one was, or two messages of one chat in flight at once. Must be 0.
- ``stuck``: accepted messages still neither applied nor dead after the drain bound.

The load test's step verdict (``Verdict``, ``step_passed``, ``step_verdict``)
and its throughput rules are views of the same report further down.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise


@dataclass(frozen=True)
class Op:
    chat: str
    seq: int
    key: str
    accepted: bool | None  # None: unknown (dispatch gave up while Redis could have stored it)
    task_id: str = ""
    reason: str = ""
    kind: str = "ok"  # which part of the mix (e.g. "ok", "crash", "fail") sent it


@dataclass(frozen=True)
class Delivery:
    key: str
    task_id: str
    chat: str
    seq: int | None
    status: int
    started: float
    ended: float


@dataclass
class Report:
    scenario: str = ""
    offered: int = 0
    accepted: int = 0
    rejected: int = 0
    unknown: int = 0
    succeeded: int = 0
    dead: int = 0
    lost: int = 0
    unexpected: int = 0
    duplicate_effects: int = 0
    redeliveries: int = 0
    concurrent_same_key: int = 0
    order_violations: int = 0
    stuck: int = 0
    drain_s: float | None = None
    dead_reasons: dict[str, int] = field(default_factory=dict)
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    lost_keys: list[str] = field(default_factory=list, repr=False)
    duplicate_keys: list[str] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("lost_keys")
        out.pop("duplicate_keys")
        return out

    def example(self, what: str, item) -> None:
        bucket = self.examples.setdefault(what, [])
        if len(bucket) < 5:
            bucket.append(item)

    @property
    def accounted(self) -> bool:
        """accepted = succeeded + dead, and nothing the checker must see as 0 is not 0."""
        return (self.accepted == self.succeeded + self.dead and self.lost == 0 and self.unexpected == 0
                and self.duplicate_effects == 0 and self.order_violations == 0 and self.stuck == 0)

    def summary(self) -> str:
        return (f"{self.scenario}: offered={self.offered} accepted={self.accepted} rejected={self.rejected} "
                f"unknown={self.unknown} succeeded={self.succeeded} dead={self.dead} lost={self.lost} "
                f"unexpected={self.unexpected} dup_effects={self.duplicate_effects} "
                f"redeliveries={self.redeliveries} concurrent_same_key={self.concurrent_same_key} "
                f"order={self.order_violations} stuck={self.stuck} "
                f"drain={self.drain_s} dead_reasons={self.dead_reasons} examples={self.examples} notes={self.notes}")


def _overlap(a: Delivery, b: Delivery) -> bool:
    return a.started < b.ended and b.started < a.ended


def _is_ok(d: Delivery) -> bool:
    return 200 <= d.status < 300


def check(ops: list[Op], deliveries: list[Delivery], dead: dict[str, str], *, scenario: str = "",
          held: set[str] | frozenset = frozenset(), repeat_is_duplicate: bool = False) -> Report:
    """Compare the histories. ``held``: task ids whose record is still in Redis; an accepted op
    neither applied nor dead is *stuck* if held (the platform still has it), else *lost*.
    ``repeat_is_duplicate``: every successful application of an accepted key past its first is a
    duplicate effect (for a sink that does not dedupe on the key, like the load test's)."""
    r = Report(scenario=scenario, offered=len(ops))
    by_key: dict[str, Op] = {}
    for op in ops:
        by_key[op.key] = op
        if op.accepted is True:
            r.accepted += 1
        elif op.accepted is False:
            r.rejected += 1
            r.rejected_reasons[op.reason] = r.rejected_reasons.get(op.reason, 0) + 1
        else:
            r.unknown += 1

    attempts: dict[str, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        attempts[d.key].append(d)
    applied = {k for k, ds in attempts.items() if any(_is_ok(d) for d in ds)}

    # Redeliveries and duplicate effects.
    for key, ds in attempts.items():
        r.redeliveries += len(ds) - 1
        ok = sorted((d for d in ds if _is_ok(d)), key=lambda d: d.started)
        tasks = {d.task_id for d in ok}
        op = by_key.get(key)
        if repeat_is_duplicate and op is not None and op.accepted is True and len(ok) > 1:
            r.duplicate_effects += len(ok) - 1  # covers two tasks of one key as well
            r.duplicate_keys.append(key)
            r.example("duplicate_effects", {"key": key, "applied": len(ok)})
        elif len(tasks) > 1:
            r.duplicate_effects += len(tasks) - 1
            r.duplicate_keys.append(key)
            r.example("duplicate_effects", {"key": key, "tasks": sorted(tasks)})
        for i, a in enumerate(ok):
            if any(_overlap(a, b) for b in ok[:i]):
                r.concurrent_same_key += 1
                r.example("concurrent_same_key", {"key": key, "at": round(a.started, 3)})
    keys_of_message: dict[tuple[str, int | None], set[str]] = defaultdict(set)
    for key in applied:
        d = attempts[key][0]
        keys_of_message[(d.chat, d.seq)].add(key)
    for message, keys in keys_of_message.items():
        if len(keys) > 1 and message[1] is not None:
            r.duplicate_effects += len(keys) - 1
            r.example("duplicate_effects", {"message": list(message), "keys": sorted(keys)})

    # Unexpected: at the sink but never accepted.
    for key in attempts:
        op = by_key.get(key)
        if op is None or op.accepted is False:
            r.unexpected += 1
            r.example("unexpected", {"key": key, "why": "never offered" if op is None else f"rejected {op.reason}"})

    # Outcome of each accepted op.
    dead_by_task = dead
    for op in ops:
        if op.accepted is not True:
            continue
        is_applied = op.key in applied
        reason = dead_by_task.get(op.task_id)
        kind = r.extra.setdefault("by_kind", {}).setdefault(op.kind, {})
        outcome = "succeeded" if is_applied else f"dead:{reason}" if reason is not None else "missing"
        kind[outcome] = kind.get(outcome, 0) + 1
        if is_applied:
            r.succeeded += 1
            if reason is not None:
                r.notes.append(f"{op.key} applied and also dead-lettered ({reason}): its effect was made once")
        elif reason is not None:
            r.dead += 1
            r.dead_reasons[reason] = r.dead_reasons.get(reason, 0) + 1
        elif op.task_id in held:
            r.stuck += 1
            r.example("stuck", op.key)
        else:
            r.lost += 1
            r.lost_keys.append(op.key)
            r.example("lost", op.key)

    # Order: per chat, first applications must follow acceptance order; no two of a chat at once.
    accepted_by_chat: dict[str, list[Op]] = defaultdict(list)
    late: list[tuple[float, str, int, int]] = []  # (first applied, chat, seq, highest seq applied before it)
    for op in ops:
        if op.accepted is True or (op.accepted is None and op.key in applied):
            accepted_by_chat[op.chat].append(op)
    for chat, chat_ops in accepted_by_chat.items():
        chat_ops.sort(key=lambda o: o.seq)
        first_ok = []
        for op in chat_ops:
            ok = [d for d in attempts.get(op.key, ()) if _is_ok(d)]
            if ok:
                first_ok.append((min(d.started for d in ok), op.seq))
        # Each message first applied after a later message of its chat is one violation.
        highest: int | None = None
        for at, seq in sorted(first_ok):
            if highest is not None and seq < highest:
                late.append((at, chat, seq, highest))
            else:
                highest = seq
        chat_attempts = sorted((d for op in chat_ops for d in attempts.get(op.key, ())), key=lambda d: d.started)
        for i, a in enumerate(chat_attempts):
            for b in chat_attempts[i + 1:]:
                if b.started >= a.ended:
                    break  # sorted by start: no later attempt overlaps ``a`` either
                if a.key != b.key:
                    r.order_violations += 1
                    r.example("order_violations", {"chat": chat, "overlap": [a.key, b.key]})
    r.order_violations += len(late)
    for _, chat, seq, highest in sorted(late, key=lambda v: v[0]):  # the earliest examples, across chats
        r.example("order_violations", {"chat": chat, "seq": seq, "after": highest})
    return r


# -- the load test's histories: what it sent, what the Lua sink applied ------------------------


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

    @classmethod
    def from_entry(cls, entry: dict) -> Sent:
        """From a line of the load generator's history (``tools.loadgen``); an unknown outcome is not accepted."""
        return cls(entry["key"], entry["chat"], entry["seq"], bool(entry["accepted"]), entry["task_id"] or None,
                   entry["reason"] or None, entry["scheduled_ms"], entry["done_ms"], entry["started_ms"])


@dataclass(frozen=True)
class Applied:
    """One entry of the sink's log: a message whose effect was applied."""

    chat: str
    seq: int
    at_ms: float
    key: str
    started_ms: float | None = None  # when the handler's first attempt began (the sink's fifth field)


@dataclass
class Verdict:
    """The load test's view of a :class:`Report`: its counts under the load test's names."""

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
    report: Report | None = field(default=None, repr=False)

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.duplicates == 0 and self.order_violations == 0 and self.unknown == 0

    @classmethod
    def of(cls, report: Report, examples: int = 5) -> Verdict:
        order = [f"chat {e['chat']}: seq {e['seq']} applied after seq {e['after']}"
                 for e in report.examples.get("order_violations", []) if "after" in e]
        return cls(accepted=report.accepted, applied=report.succeeded, dead=report.dead, lost=report.lost,
                   duplicates=report.duplicate_effects, order_violations=report.order_violations,
                   unknown=report.unexpected, lost_keys=report.lost_keys[:examples],
                   duplicate_keys=report.duplicate_keys[:examples], order_examples=order[:examples], report=report)


def parse_log_line(line: str | bytes) -> Applied | None:
    """Parse the sink's ``chat\\tseq\\tms\\tkey[\\tstarted ms]`` line; None when it is not one."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    parts = text.split("\t")
    if len(parts) not in (4, 5):
        return None
    try:
        started = float(parts[4]) if len(parts) == 5 and parts[4] else None
        return Applied(parts[0], int(parts[1]), float(parts[2]), parts[3], started)
    except ValueError:
        return None


def load_histories(sent: Iterable[Sent], log: Sequence[Applied], counts: dict[str, int],
                   dead_task_ids: Iterable[str] = ()) -> tuple[list[Op], list[Delivery], dict[str, str]]:
    """The load test's histories as :func:`check` takes them.

    Each key applied ``counts[key]`` times becomes that many successful
    deliveries. Their times are positions in the log (the order Redis received
    the writes, the order the load test judges); applications whose log line
    was trimmed (past the sink's cap: the oldest) come before all others.
    """
    accepted = {s.key: s for s in sent if s.accepted}
    rejected = {s.key: s for s in sent if not s.accepted and s.key not in accepted}
    ops = [Op(s.chat, s.seq, s.key, s.accepted, s.task_id or "", s.reason or "")
           for s in [*accepted.values(), *rejected.values()]]
    positions: dict[str, list[tuple[int, Applied]]] = defaultdict(list)
    for i, entry in enumerate(log):
        positions[entry.key].append((i, entry))
    deliveries = []
    for key in [*accepted, *(k for k in counts if k not in accepted)]:
        n = counts.get(key, 0)
        s = accepted.get(key)
        logged = positions.get(key, [])
        for j in range(n):
            at, entry = logged[j] if j < len(logged) else (-1, None)
            chat = entry.chat if entry else (s.chat if s else "")
            seq = entry.seq if entry else (s.seq if s else None)
            deliveries.append(Delivery(key, (s.task_id or "") if s else "", chat, seq, 200, float(at), float(at)))
    dead = dict.fromkeys(dead_task_ids, "dead letter")
    return ops, deliveries, dead


def check_applied(
    sent: Iterable[Sent],
    log: Sequence[Applied],
    counts: dict[str, int],
    dead_task_ids: Iterable[str] = (),
    examples: int = 5,
) -> Verdict:
    """Account for every accepted message of a load test step: :func:`check` on the sink's record.

    ``counts`` is the sink's key -> times applied; ``log`` its entries in the
    order applied. The Lua sink does not dedupe, so every repeated application
    of a key is a duplicate effect; a message of a chat must be first applied
    after every earlier accepted message of that chat that was applied (strict
    per-chat FIFO).
    """
    ops, deliveries, dead = load_histories(sent, log, counts, dead_task_ids)
    return Verdict.of(check(ops, deliveries, dead, repeat_is_duplicate=True), examples)


@dataclass(frozen=True)
class RowWritten:
    """A record the handler wrote for one message (the SMS demo's ``SmsMessage`` row): its key, task and time."""

    key: str
    task_id: str
    at_ms: float  # when it was written (epoch ms)


def check_rows(sent: Iterable[Sent], rows: Sequence[RowWritten], dead_task_ids: Iterable[str] = (),
               held: set[str] | frozenset = frozenset(), examples: int = 5) -> Verdict:
    """Account for every accepted message by the one row its handler writes: :func:`check` on the rows.

    A message with no row is lost unless it is a dead letter, or its task is
    still ``held`` by the platform (then it is pending: ``report.stuck``). A
    second row of a key, or a row written by a task other than the one
    admission answered for that key (the message ran as two tasks), is a
    duplicate; a row of a key never accepted is unknown. Messages promise no
    order among themselves: each is its own "chat" here.
    """
    sent = list(sent)
    ops = [Op(s.key, 0, s.key, s.accepted, s.task_id or "", s.reason or "") for s in sent]
    deliveries = [Delivery(r.key, r.task_id, r.key, 0, 200, r.at_ms, r.at_ms) for r in rows]
    report = check(ops, deliveries, dict.fromkeys(dead_task_ids, "dead letter"), held=held,
                   repeat_is_duplicate=True)
    task_of = {s.key: s.task_id for s in sent if s.accepted and s.task_id}
    for r in rows:
        if r.key in task_of and r.task_id != task_of[r.key]:
            report.duplicate_effects += 1
            report.duplicate_keys.append(r.key)
            report.example("duplicate_effects", {"key": r.key, "tasks": [task_of[r.key], r.task_id]})
    return Verdict.of(report, examples)


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


def chat_stalls(ops: list[Op], dispatched_at: dict[str, float], deliveries: list[Delivery], *, bound: float,
                until: float, dead: dict[str, str] | None = None) -> tuple[int, float, list[dict]]:
    """Per chat, the longest time it had an accepted message waiting and saw nothing move.

    A chat is *owed* progress from a message's dispatch (``dispatched_at`` by
    key) until that message's first successful delivery ended (``until`` if it
    never did; a dead-lettered message is left out). Progress is any delivery
    of the chat starting or ending. Returns (chats whose longest wait exceeded
    ``bound``, the longest wait of any chat in seconds, examples): a per-chat
    timeline measure, not the speed of the run.
    """
    by_chat: dict[str, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_chat[d.chat].append(d)
    first_ok: dict[str, float] = {}
    for d in deliveries:
        if 200 <= d.status < 300:
            first_ok[d.key] = min(first_ok.get(d.key, d.ended), d.ended)
    points = {chat: sorted([d.started for d in ds] + [d.ended for d in ds]) for chat, ds in by_chat.items()}
    worst_by_chat: dict[str, tuple[float, float]] = {}
    for op in ops:
        start = dispatched_at.get(op.key)
        if op.accepted is not True or start is None or op.task_id in (dead or {}):
            continue
        end = first_ok.get(op.key, until)
        marks = [start, *(p for p in points.get(op.chat, ()) if start < p < end), end]
        gap, at = max(((b - a), a) for a, b in pairwise(marks))
        if gap > worst_by_chat.get(op.chat, (0.0, 0.0))[0]:
            worst_by_chat[op.chat] = (gap, at)
    stalled = {chat: v for chat, v in worst_by_chat.items() if v[0] > bound}
    examples = [{"chat": chat, "waited_s": round(gap, 2), "from": round(at, 3)}
                for chat, (gap, at) in sorted(stalled.items(), key=lambda kv: -kv[1][0])[:5]]
    worst = max((v[0] for v in worst_by_chat.values()), default=0.0)
    return len(stalled), round(worst, 2), examples
