"""The campaign's checker, Jepsen-style: what was offered and accepted against what happened.

Pure: no Django, Redis or Celery import; it is given three histories and returns
a ``Report``.

- **ops** (the load generator's history): one ``Op`` per logical message (chat,
  seq), with the final answer of dispatch: accepted, rejected, or unknown (every
  call failed with ``unavailable`` and at least one may have stored it).
- **deliveries** (the HTTP sink's record): every POST that reached it, with its
  ``Idempotency-Key``, task id, chat, seq, status and when it started and ended.
- **dead** (the dead-letter table): task id -> reason.

Measures:

- ``lost``: accepted, never applied (2xx at the sink) and never dead-lettered.
- ``unexpected``: reached the sink but was never accepted (a rejected or
  never-offered message ran: a half-written admission).
- ``duplicate_effects``: effects a sink that dedupes on ``Idempotency-Key``
  would still apply twice: one logical message applied under two keys or by two
  tasks (admission let it in twice). Must be 0.
- ``redeliveries``: attempts beyond the first per key (allowed: at-least-once).
- ``concurrent_same_key``: successful attempts of one key in flight at the same
  time at the sink. After a worker is killed mid-request, the receiver may still
  be working on the dead worker's request when the redelivery arrives: allowed
  (a redelivery; receivers must dedupe atomically). Where no process is killed
  it would mean two live executions of one task: scenarios assert 0 there.
- ``order_violations``: per chat, a message first applied before an earlier
  accepted one, or two messages of one chat in flight at once. Must be 0.
- ``stuck``: accepted messages still neither applied nor dead after the drain bound.
"""

from __future__ import annotations

from collections import defaultdict
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

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("lost_keys")
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


def check(ops: list[Op], deliveries: list[Delivery], dead: dict[str, str], *, scenario: str = "",
          held: set[str] | frozenset = frozenset()) -> Report:
    """Compare the histories. ``held``: task ids whose record is still in Redis; an accepted op
    neither applied nor dead is *stuck* if held (the platform still has it), else *lost*."""
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
    applied = {k for k, ds in attempts.items() if any(200 <= d.status < 300 for d in ds)}

    # Redeliveries and duplicate effects.
    for key, ds in attempts.items():
        r.redeliveries += len(ds) - 1
        ok = sorted((d for d in ds if 200 <= d.status < 300), key=lambda d: d.started)
        tasks = {d.task_id for d in ok}
        if len(tasks) > 1:
            r.duplicate_effects += len(tasks) - 1
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
    for op in ops:
        if op.accepted is True or (op.accepted is None and op.key in applied):
            accepted_by_chat[op.chat].append(op)
    for chat, chat_ops in accepted_by_chat.items():
        chat_ops.sort(key=lambda o: o.seq)
        first_ok = []
        for op in chat_ops:
            ok = [d for d in attempts.get(op.key, ()) if 200 <= d.status < 300]
            if ok:
                first_ok.append((min(d.started for d in ok), op.seq))
        ordered = [seq for _, seq in sorted(first_ok)]
        for a, b in pairwise(ordered):
            if b < a:
                r.order_violations += 1
                r.example("order_violations", {"chat": chat, "applied": f"{a} then {b}"})
        chat_attempts = sorted((d for op in chat_ops for d in attempts.get(op.key, ())), key=lambda d: d.started)
        for i, a in enumerate(chat_attempts):
            for b in chat_attempts[i + 1:]:
                if b.started >= a.ended:
                    break  # sorted by start: no later attempt overlaps ``a`` either
                if a.key != b.key:
                    r.order_violations += 1
                    r.example("order_violations", {"chat": chat, "overlap": [a.key, b.key]})
    return r


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
