"""The verified stepped load test that ``manage.py loadtest`` runs against a live platform.

For each step (a rate in tasks/s held for ``step_seconds``) the open-loop
generator (``tools/loadgen.py``, the fault campaign's too) dispatches
chat-scoped messages of the sink type on a fixed schedule: message ``i`` is
due at ``start + i / rate`` whatever happened to earlier ones, and its
dispatch latency is measured from that due time, so a slow platform shows up
as latency instead of being hidden by a generator that waits for it
(coordinated omission). Each chat's messages are sent by one sender thread in
order, carrying a per-chat sequence number and a unique idempotency key.
Enqueue->start (``start_ms``) runs from the dispatch call to the moment the
sink's first attempt began (the sink writes it into its record).

The sink handler (``tools/sink.py``; ``loadtest.sink``, or its batched twin
``loadtest.sink_batch``, whose calls it also counts) records every applied
message in Redis. With ``bulk`` the generator sends with ``dispatch_many``
(``loadgen.send_bulk``); with ``limit_key_count`` each chat's messages carry
one of that many limit keys (for types with a key-scoped limit). After the
step the test waits for the step's tasks to reach a terminal state, reads
the record back and checks it with ``tools.loadcheck``: lost, duplicated and
out-of-order effects, and dead letters. It also measures what
each task cost: Redis commands (``INFO commandstats`` deltas), Redis round
trips and SQL statements when the workers run with ``tools.probe``
(``--probe-dir``), and result rows written.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lanes import keys
from lanes.redis_client import get_redis
from tasks import config
from tasks.bulk import dispatch_many
from tasks.dispatch import admit
from tools import loadgen, probe
from tools.loadcheck import (
    Sent,
    StepLoad,
    check_applied,
    completed_between,
    depth_grows,
    depth_slope,
    knee,
    parse_log_line,
    percentiles,
    step_verdict,
    sustained,
)
from tools.sink import applied_key, calls_key, log_key

#: The handlers whose record the load test reads (tools/sink.py): one message per call, or a batch.
SINK_HANDLER, BATCH_SINK_HANDLER = "loadtest.sink", "loadtest.sink_batch"
#: The type ``--batched`` creates when no other is named, and its batch shape unless told.
BATCHED_TYPE = "loadtest.sink_batch"
DEFAULT_BATCH_SIZE, DEFAULT_BATCH_WINDOW_MS = 100, 5

#: Commands the sink itself runs per applied message (sink_record.lua: EVALSHA, HEXISTS, HLEN for a new key,
#: HINCRBY, RPUSH, LTRIM, 2 x EXPIRE): the workload, not the platform.
SINK_COMMANDS_PER_TASK = 8
#: The batched sink's record (sink_record_batch.lua): HEXISTS, HLEN, HINCRBY per item; per call EVALSHA,
#: RPUSH, LTRIM, 2 x EXPIRE, INCR, EXPIRE.
BATCH_SINK_COMMANDS_PER_ITEM, BATCH_SINK_COMMANDS_PER_CALL = 3, 7
EXIT_OK, EXIT_STEP_FAILED, EXIT_INCORRECT = 0, 1, 3
#: Most seconds the "completed during the step" window is shifted by the end-to-end latency.
MAX_WINDOW_SHIFT_S = 1.0


@dataclass
class LoadTestOptions:
    # Matched to `make run`'s defaults (tasks/worker_groups.py DEFAULT_GROUPS: the realtime lane has two
    # worker instances x 16 threads): 100 and 200/s are well under what they complete on a
    # 2-core machine, so a fresh clone's first steps pass; 400/s is the flow-control target; 500 looks past it.
    steps: list[int] = field(default_factory=lambda: [100, 200, 300, 400, 500])
    step_seconds: float = 30.0
    chats: int = 1000
    latency_ms: float = 20.0
    fail_rate: float = 0.01
    type_name: str = "loadtest.sink"
    drain_limit_s: float = 10.0
    settle_s: float = 60.0
    senders: int = 0  # generator threads; 0: per step, loadgen.senders_for(rate, chats)
    drop_every: int = 0
    stop_on_fail: bool = True
    probe_dir: str | None = None
    seed: int | None = None
    bulk: int = 0  # > 0: send with dispatch_many, chunks of up to this many items
    limit_key_count: int = 0  # > 0: each chat's messages carry one of this many limit keys


@dataclass
class StepReport:
    rate: int
    seconds: float = 0.0
    sent: int = 0
    accepted: int = 0
    offered_per_s: float = 0.0
    accepted_per_s: float = 0.0
    completed_per_s: float = 0.0
    completed_during_per_s: float = 0.0  # distinct messages applied while the step ran, per second
    backlog_at_end: int = 0  # accepted but not applied when the step's load ended
    depth_slope_per_s: float = 0.0  # how fast the lane's depth rose during the step
    depth_grows: bool = False
    rejections: dict[str, int] = field(default_factory=dict)
    dispatch_ms: dict[str, float | None] = field(default_factory=dict)
    dispatch_call_ms: dict[str, float | None] = field(default_factory=dict)
    e2e_ms: dict[str, float | None] = field(default_factory=dict)
    #: Enqueue->start: the dispatch call began -> the handler began, over messages whose first attempt applied.
    start_ms: dict[str, float | None] = field(default_factory=dict)
    max_schedule_lag_ms: float = 0.0
    peak_depth: int = 0
    drained: bool = False
    drain_s: float | None = None
    applied: int = 0
    dead: int = 0
    lost: int = 0
    duplicates: int = 0
    order_violations: int = 0
    unknown: int = 0
    pending: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)
    redis_commands_per_task: float | None = None
    platform_commands_per_task: float | None = None
    evalsha_per_task: float | None = None
    commands_per_task: dict[str, float] = field(default_factory=dict)
    redis_round_trips_per_task: float | None = None
    dispatch_round_trips_per_task: float | None = None
    sql_per_task: dict[str, float] = field(default_factory=dict)
    result_rows_per_task: float | None = None
    handler_calls: int | None = None  # calls of the batched sink for the step's tasks (None: not batched)
    tasks_per_call: float | None = None  # accepted tasks per batched call (attempts that failed count too)
    mean_chunk: float | None = None  # items per dispatch_many call (--bulk), weighted by item
    passed: bool = False
    why: str = ""
    interrupted: bool = False


@dataclass
class LoadTestReport:
    run: str
    type: str
    lane: str
    options: dict
    steps: list[StepReport] = field(default_factory=list)
    sustained_rate: int | None = None
    knee_rate: int | None = None  # lowest step whose queue depth grew during the step
    interrupted: bool = False
    exit_code: int = EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LoadTestError(Exception):
    """The load test cannot run (unknown type, not chat-scoped, wrong handler, limit keys it cannot use)."""


def ensure_batched_type(name: str, *, lane: str, batch_size: int = DEFAULT_BATCH_SIZE,
                        batch_window_ms: int = DEFAULT_BATCH_WINDOW_MS) -> None:
    """Create the chat-scoped type ``name`` of the batched sink on ``lane``, or set its batch shape.

    Shaped as the default config's ``loadtest.sink`` (same policy, timeouts and
    chat queue size) so the two paths differ only by batching. A type of that
    name with another handler is an error, never overwritten.
    """
    from django.core.exceptions import ValidationError

    from lanes.models import Lane
    from tasks.models import RetryPolicy, TaskType

    existing = TaskType.objects.filter(name=name).first()
    if existing is not None and existing.handler != BATCH_SINK_HANDLER:
        raise LoadTestError(f"task type {name!r} runs {existing.handler!r}; --batched needs a type of "
                            f"{BATCH_SINK_HANDLER} (name another with --type)")
    if existing is None:
        lane_obj = Lane.objects.filter(name=lane).first()
        if lane_obj is None:
            raise LoadTestError(f"no lane named {lane!r} for the batched type (apply the default config, or --lane)")
        policy = RetryPolicy.objects.filter(name="fast").first() or RetryPolicy.objects.get_or_create(
            name="loadtest", defaults={"max_retries": 5, "initial_backoff": 0.2, "max_backoff": 5.0})[0]
        existing = TaskType(name=name, handler=BATCH_SINK_HANDLER, lane=lane_obj, retry_policy=policy, priority=5,
                            timeout=120, attempt_timeout=10, chat_scoped=True, chat_queue_size=1000, options={})
    elif (existing.batch_size, existing.batch_window_ms, existing.chat_scoped) == \
            (batch_size, batch_window_ms, True):
        return
    existing.batch_size, existing.batch_window_ms, existing.chat_scoped = batch_size, batch_window_ms, True
    try:
        existing.full_clean()
    except ValidationError as exc:
        raise LoadTestError(f"batched type {name!r}: {'; '.join(exc.messages)}") from None
    existing.save()  # saving bumps the config version: workers and this process see it within seconds


Progress = Callable[[str], None]


class LoadTest:
    def __init__(self, options: LoadTestOptions, progress: Progress | None = None,
                 stop: threading.Event | None = None) -> None:
        self.o = options
        self.progress = progress or (lambda line: None)
        self.stop = stop or threading.Event()
        self.r = get_redis()
        self.run_id = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.rng = random.Random(options.seed)
        self.chat_seq: dict[int, int] = {}
        self.depth_samples: dict[int, list[tuple[float, float]]] = {}  # step index -> (s into the step, depth)
        self.own_round_trips = 0  # Redis requests this process made that are not dispatches
        self.own_commands: Counter = Counter()  # by name, to take out of INFO commandstats
        probe.install()
        snap = config.refresh_if_changed()
        tc = snap.types.get(options.type_name)
        if tc is None:
            raise LoadTestError(f"no task type named {options.type_name!r} (apply the default config?)")
        if not tc.chat_scoped:
            raise LoadTestError(f"task type {tc.name!r} is not chat-scoped")
        if tc.handler not in (SINK_HANDLER, BATCH_SINK_HANDLER):
            raise LoadTestError(f"task type {tc.name!r} runs {tc.handler!r}, not the {SINK_HANDLER} or "
                                f"{BATCH_SINK_HANDLER} handler")
        if options.limit_key_count > 0 and not tc.needs_limit_key:
            raise LoadTestError(f"--limit-key-count needs a type with a key-scoped limit; task type {tc.name!r} "
                                f"has {_limits_shown(tc)}")
        if tc.needs_limit_key and options.limit_key_count <= 0:
            raise LoadTestError(f"task type {tc.name!r} has a key-scoped limit ({_limits_shown(tc)}): every "
                                f"dispatch needs a limit key; give --limit-key-count K")
        self.batched = tc.handler == BATCH_SINK_HANDLER
        self.tc = tc
        self.lane = tc.lane
        self.report = LoadTestReport(self.run_id, tc.name, tc.lane, asdict(options))

    # -- the run -----------------------------------------------------------
    def run(self) -> LoadTestReport:
        for rate in self.o.steps:
            if self.stop.is_set():
                break
            step = self._step(rate)
            self.report.steps.append(step)
            if step.interrupted:
                break
            if not step.passed and self.o.stop_on_fail:
                break
        report = self.report
        report.interrupted = self.stop.is_set()
        report.sustained_rate = sustained([(s.rate, s.passed) for s in report.steps])
        report.knee_rate = knee([(s.rate, self.depth_samples.get(i, [])) for i, s in enumerate(report.steps)])
        if any(s.lost or s.duplicates or s.order_violations or s.unknown for s in report.steps):
            report.exit_code = EXIT_INCORRECT
        elif any(not s.passed for s in report.steps) or report.interrupted:
            report.exit_code = EXIT_STEP_FAILED
        return report

    def _step(self, rate: int) -> StepReport:
        o = self.o
        step = StepReport(rate=rate)
        index = len(self.report.steps)
        step_run = f"{self.run_id}-s{index}"
        n = max(1, int(rate * o.step_seconds))
        n_senders = o.senders if o.senders > 0 else loadgen.senders_for(rate, o.chats)
        plan: list[list[tuple[int, int, int]]] = [[] for _ in range(n_senders)]
        for i in range(n):
            chat = self.rng.randrange(o.chats)
            seq = self.chat_seq.get(chat, 0) + 1
            self.chat_seq[chat] = seq
            plan[chat % len(plan)].append((i, chat, seq))
        n_keys = o.limit_key_count
        payload_base: dict[str, Any] = {"run": step_run, "latency_ms": o.latency_ms, "fail_rate": o.fail_rate}
        if o.drop_every:
            payload_base["drop_every"] = o.drop_every

        before_stats = self._commandstats()
        self.own_commands, self.own_round_trips = Counter(info=1), 0  # the INFO above shows in the next snapshot
        before_probe = probe.read_dir(o.probe_dir) if o.probe_dir else {}
        before_local = probe.snapshot()
        before_rows = _result_rows()
        results: list[Sent] = []
        run = self.run_id
        schedules = [loadgen.planned([loadgen.Message(i, self.tc.name, f"lt-{run}-{chat}", seq,
                                                      f"lt:{run}:{chat}:{seq}", {**payload_base, "seq": seq},
                                                      limit_key=f"lt-key-{chat % n_keys}" if n_keys else None)
                                      for i, chat, seq in part])
                     for part in plan]
        start = time.time() + 0.05
        monitor = _Monitor(self, step, step_run, index, start, n)
        monitor.start()
        # Open loop, no retries (retry_for=0): each answer is what the step measures.
        chunks: list[int] = []

        def record(entry: dict) -> None:
            results.append(Sent.from_entry(entry))
            if "chunk" in entry:
                chunks.append(entry["chunk"])

        if o.bulk > 0:
            loadgen.send_bulk(schedules, dispatch_many=dispatch_many, bulk=o.bulk, start=start, rate=rate,
                              stop=self.stop, retry_for=0, timeout=self.tc.timeout_s, record=record,
                              name="loadtest-bulk")
        else:
            loadgen.send(schedules, admit=admit, start=start, rate=rate, stop=self.stop, retry_for=0,
                         timeout=self.tc.timeout_s, record=record, name="loadtest-sender")
        end = time.time()
        sent = sorted(results, key=lambda s: s.scheduled_ms)
        step.interrupted = self.stop.is_set()
        step.seconds = round(end - start, 3)
        step.sent = len(sent)
        accepted = [s for s in sent if s.accepted]
        step.accepted = len(accepted)
        step.offered_per_s = round(len(sent) / max(1e-9, end - start), 1)
        step.accepted_per_s = round(len(accepted) / max(1e-9, end - start), 1)
        step.rejections = dict(Counter(s.reason or "?" for s in sent if not s.accepted))
        step.dispatch_ms = _rounded(percentiles([s.done_ms - s.scheduled_ms for s in sent]))
        step.dispatch_call_ms = _rounded(percentiles([s.done_ms - s.started_ms for s in sent]))
        step.max_schedule_lag_ms = round(max((s.done_ms - s.scheduled_ms for s in sent), default=0.0), 3)
        if chunks:
            step.mean_chunk = round(sum(chunks) / len(chunks), 1)
        local_rt = probe.snapshot().get("redis_round_trips", 0) - before_local.get("redis_round_trips", 0)
        local_rt = max(0, local_rt - self.own_round_trips)  # the dispatches' own requests

        # Drain: wait until every accepted task of the step is done or dead.
        monitor.phase = "drain"
        drained, drain_s, pending = self._drain(accepted, end)
        monitor.stop()
        after_stats = self._commandstats()
        after_probe = probe.read_dir(o.probe_dir) if o.probe_dir else {}
        after_rows = _result_rows()
        step.drained, step.drain_s, step.pending = drained, drain_s, pending
        step.peak_depth = monitor.peak_depth
        self.depth_samples[index] = monitor.samples
        step.depth_slope_per_s = round(depth_slope(monitor.samples), 1)
        step.depth_grows = depth_grows(rate, monitor.samples)

        counts, log = self._read_record(step_run)
        if self.batched:
            step.handler_calls = int(self.r.get(calls_key(step_run)) or 0)  # read after the cost snapshot
            if step.handler_calls:
                step.tasks_per_call = round(len(accepted) / step.handler_calls, 1)
        applied_keys = {k for k, v in counts.items() if v > 0}
        dead_ids = _dead_task_ids([s.task_id for s in accepted if s.key not in applied_keys and s.task_id])
        verdict = check_applied(sent, log, counts, dead_ids)
        step.applied, step.dead, step.lost = verdict.applied, verdict.dead, verdict.lost
        step.duplicates, step.order_violations, step.unknown = verdict.duplicates, verdict.order_violations, \
            verdict.unknown
        if pending and verdict.lost:
            # Still running at the end of the settle time: not lost (yet), but not accounted for either.
            step.lost = max(0, verdict.lost - pending)
        step.examples = {k: v for k, v in {"lost": verdict.lost_keys, "duplicates": verdict.duplicate_keys,
                                            "order": verdict.order_examples}.items() if v}
        by_key = {s.key: s for s in accepted}
        e2e, starts = [], []
        first_seen: set[str] = set()
        for entry in log:
            s = by_key.get(entry.key)
            if s is None or entry.key in first_seen:
                continue
            first_seen.add(entry.key)
            e2e.append(entry.at_ms - s.scheduled_ms)
            if entry.started_ms is not None:
                starts.append(entry.started_ms - s.started_ms)
        step.e2e_ms = _rounded(percentiles(e2e))
        step.start_ms = _rounded(percentiles(starts, (50, 99)))
        if log:
            span = max(e.at_ms for e in log) / 1000 - start
            step.completed_per_s = round(verdict.applied / max(span, 1e-9), 1)
        self._costs(step, before_stats, after_stats, before_probe, after_probe, local_rt, before_rows, after_rows)
        accepted_keys = {s.key for s in accepted}
        done_by_end = completed_between(log, accepted_keys, start * 1000, end * 1000)
        # The completion rate over the step's length, its window shifted by the typical end-to-end
        # latency (at most MAX_WINDOW_SHIFT_S): a platform that keeps up completes at the offered rate a
        # little later; one that falls behind completes at its capacity whatever the shift.
        shift_s = min(MAX_WINDOW_SHIFT_S, (step.e2e_ms.get("p50") or 0.0) / 1000)
        in_window = completed_between(log, accepted_keys, (start + shift_s) * 1000, (end + shift_s) * 1000)
        step.completed_during_per_s = round(in_window / max(1e-9, end - start), 1)
        step.backlog_at_end = max(0, len(accepted) - done_by_end)
        ok, why = step_verdict(verdict, StepLoad(rate, step.offered_per_s, step.completed_during_per_s,
                                                 step.backlog_at_end, drained, drain_s, o.drain_limit_s))
        if step.interrupted:
            ok, why = False, "interrupted; " + why
        step.passed, step.why = ok, why
        self.progress("")
        return step

    def _drain(self, accepted: list[Sent], end: float) -> tuple[bool, float | None, int]:
        """Poll the task records until all are terminal; returns (drained, seconds after the step, pending)."""
        unresolved = [(s.task_id, s.chat) for s in accepted if s.task_id]
        limit = end + self.o.drain_limit_s + (self.o.settle_s if not self.stop.is_set() else 0.0)
        while True:
            still = []
            for lo in range(0, len(unresolved), 2000):
                batch = unresolved[lo:lo + 2000]
                pipe = self.r.pipeline(transaction=False)
                for task_id, chat in batch:
                    pipe.hget(keys.task_record(task_id, chat), "st")
                states = pipe.execute()
                self.own_round_trips += 1
                self.own_commands["hget"] += len(batch)
                still += [t for t, st in zip(batch, states, strict=True) if st not in (b"done", b"dead", None)]
                if still:  # tasks finish roughly in order: no need to look further this round
                    still += unresolved[lo + 2000:]
                    break
            unresolved = still
            now = time.time()
            if not unresolved:
                return True, round(max(0.0, now - end), 3), 0
            if now > limit:
                return False, None, len(unresolved)
            time.sleep(0.1)

    def _read_record(self, step_run: str) -> tuple[dict[str, int], list]:
        raw = self.r.hgetall(applied_key(step_run))
        counts = {k.decode(): int(v) for k, v in raw.items()}
        log = []
        start = 0
        while True:
            chunk = self.r.lrange(log_key(step_run), start, start + 9999)
            for line in chunk:
                entry = parse_log_line(line)
                if entry is not None:
                    log.append(entry)
            if len(chunk) < 10000:
                break
            start += 10000
        return counts, log

    # -- cost accounting ---------------------------------------------------
    def _commandstats(self) -> dict[str, int]:
        info = self.r.info("commandstats")
        self.own_round_trips += 1
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()}

    def _costs(self, step: StepReport, before: dict, after: dict, before_probe: dict, after_probe: dict,
               local_rt: int, before_rows: int | None, after_rows: int | None) -> None:
        tasks = step.accepted
        if not tasks:
            return
        own = self.own_commands
        self.own_commands = Counter()
        delta = {k: after.get(k, 0) - before.get(k, 0) - own.get(k, 0) for k in after}
        delta = {k: v for k, v in delta.items() if v > 0}
        total = sum(delta.values())
        step.redis_commands_per_task = round(total / tasks, 2)
        sink = SINK_COMMANDS_PER_TASK * step.applied if step.handler_calls is None else \
            BATCH_SINK_COMMANDS_PER_ITEM * step.applied + BATCH_SINK_COMMANDS_PER_CALL * step.handler_calls
        step.platform_commands_per_task = round((total - sink) / tasks, 2)
        step.evalsha_per_task = round((delta.get("evalsha", 0) + delta.get("eval", 0)) / tasks, 2)
        step.commands_per_task = {k: round(v / tasks, 2) for k, v in sorted(delta.items(), key=lambda kv: -kv[1])
                                  if v / tasks >= 0.05}
        step.dispatch_round_trips_per_task = round(local_rt / tasks, 2)
        if after_probe:
            d = probe.diff(after_probe, before_probe)
            worker_rt = d.get("redis_round_trips", 0)
            step.redis_round_trips_per_task = round((worker_rt + local_rt) / tasks, 2)
            step.sql_per_task = {k.removeprefix("sql_"): round(v / tasks, 2) for k, v in sorted(d.items())
                                 if k.startswith("sql_")}
        if before_rows is not None and after_rows is not None:
            step.result_rows_per_task = round((after_rows - before_rows) / tasks, 2)


class _Monitor:
    """Samples lane depth and progress while a step runs and drains; prints the progress line."""

    def __init__(self, test: LoadTest, step: StepReport, step_run: str, index: int, start: float, n: int) -> None:
        self.test, self.step, self.step_run, self.index, self.start_at, self.n = test, step, step_run, index, start, n
        self.peak_depth = 0
        self.samples: list[tuple[float, float]] = []  # (seconds into the step, depth) while the load runs
        self.phase = "load"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loadtest-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        t = self.test
        lane = t.lane
        queues = keys.lane_queues(lane)
        last_print = 0.0
        last_applied, last_at = 0, time.time()
        rate_now = 0.0
        while not self._stop.wait(0.25):
            pipe = t.r.pipeline(transaction=False)
            for q in queues:
                pipe.llen(q)
            pipe.get(keys.lane_chat_waiting(lane))
            pipe.zcard(keys.lane_delayed(lane))
            pipe.hlen(applied_key(self.step_run))
            try:
                values = pipe.execute()
            except Exception:  # noqa: BLE001 - a missed sample is not worth stopping the test
                continue
            t.own_round_trips += 1
            t.own_commands.update(llen=len(queues), get=1, zcard=1, hlen=1)
            depth = sum(int(v or 0) for v in values[:-1])
            applied = int(values[-1] or 0)
            self.peak_depth = max(self.peak_depth, depth)
            now = time.time()
            if self.phase == "load" and now >= self.start_at:
                self.samples.append((now - self.start_at, depth))
            if now - last_at >= 1.0:
                rate_now = (applied - last_applied) / (now - last_at)
                last_applied, last_at = applied, now
            if now - last_print >= 0.5:
                last_print = now
                elapsed = max(0.0, now - self.start_at)
                due = min(self.n, int(elapsed * self.step.rate))
                t.progress(
                    f"step {self.index + 1}/{len(t.o.steps)} {self.step.rate}/s {self.phase} "
                    f"t={elapsed:5.1f}s due={due}/{self.n} applied={applied} ({rate_now:.0f}/s) depth={depth} "
                    f"peak={self.peak_depth}"
                )


#: Printed under a failed step: the knobs that size `make run`'s workers (README, "Environment variables").
WORKER_HINT = (
    "hint: completions fell behind the offered rate. The realtime lane's capacity is set by `make run`'s worker "
    "knobs: more instances (WORKER_REALTIME_INSTANCES, one Celery main process each: the usual limit), "
    "WORKER_POOL=threads with WORKER_CONCURRENCY / WORKER_REALTIME_CONCURRENCY for I/O-bound handlers, "
    "WORKER_LOGLEVEL=WARNING, and WORKER_EVENTS=0 (Flower then shows no tasks); see the README."
)


def _limits_shown(tc: config.TypeConf) -> str:
    if not tc.limits:
        return "no limits"
    return "limits " + ", ".join(f"{ref.name} ({ref.scope})" for ref in tc.limits)


def _rounded(values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: (round(v, 2) if v is not None else None) for k, v in values.items()}


def _result_rows() -> int | None:
    """Highest result-row id (rows written = its delta); None if the table is unreadable."""
    from django.db import DatabaseError
    from django.db.models import Max
    from django_celery_results.models import TaskResult

    try:
        return TaskResult.objects.aggregate(m=Max("id"))["m"] or 0
    except DatabaseError:
        return None


def _dead_task_ids(task_ids: list[str]) -> set[str]:
    from tasks.models import DeadLetter

    found: set[str] = set()
    for lo in range(0, len(task_ids), 500):
        found.update(DeadLetter.objects.filter(task_id__in=task_ids[lo:lo + 500]).values_list("task_id", flat=True))
    return found


# -- presentation ---------------------------------------------------------
TABLE_COLUMNS = ["rate", "offered/s", "accepted/s", "completed/s", "done in step/s", "backlog at end",
                 "depth/s", "rejected", "disp p50/p95/p99 ms", "start p50/p99 ms", "e2e p50/p95/p99 ms",
                 "peak depth", "drain s",
                 "lost", "dup", "order", "dead",
                 "cmds/task", "rt/task", "sql/task", "result", "why"]


def table_columns(report: LoadTestReport) -> list[str]:
    """TABLE_COLUMNS, with tasks per handler call (a batched sink) and items per dispatch_many call (--bulk)."""
    extra = [name for name, shown in (("tasks/call", any(s.handler_calls is not None for s in report.steps)),
                                      ("chunk", any(s.mean_chunk is not None for s in report.steps))) if shown]
    at = TABLE_COLUMNS.index("cmds/task")
    return TABLE_COLUMNS[:at] + extra + TABLE_COLUMNS[at:]


def table_rows(report: LoadTestReport) -> list[dict[str, Any]]:
    rows = []
    for s in report.steps:
        rows.append({
            "rate": s.rate, "offered/s": s.offered_per_s, "accepted/s": s.accepted_per_s,
            "completed/s": s.completed_per_s, "done in step/s": s.completed_during_per_s,
            "backlog at end": s.backlog_at_end, "depth/s": s.depth_slope_per_s,
            "rejected": sum(s.rejections.values()),
            "disp p50/p95/p99 ms": _triple(s.dispatch_ms), "e2e p50/p95/p99 ms": _triple(s.e2e_ms),
            "start p50/p99 ms": _triple(s.start_ms, ("p50", "p99")),
            "peak depth": s.peak_depth, "drain s": s.drain_s if s.drained else "no",
            "lost": s.lost, "dup": s.duplicates, "order": s.order_violations, "dead": s.dead,
            "tasks/call": s.tasks_per_call, "chunk": s.mean_chunk,
            "cmds/task": s.redis_commands_per_task,
            "rt/task": s.redis_round_trips_per_task if s.redis_round_trips_per_task is not None
            else (f"{s.dispatch_round_trips_per_task}+?" if s.dispatch_round_trips_per_task is not None else None),
            "sql/task": (s.sql_per_task.get("statements") if s.sql_per_task
                         else (f"{s.result_rows_per_task} rows" if s.result_rows_per_task is not None else None)),
            "result": "PASS" if s.passed else "FAIL", "why": s.why,
        })
    return rows


def _triple(p: dict[str, float | None], names: tuple[str, ...] = ("p50", "p95", "p99")) -> str:
    def f(v: float | None) -> str:
        return "-" if v is None else (f"{v:.0f}" if v >= 10 else f"{v:.1f}")
    return "/".join(f(p.get(k)) for k in names)


def plot(report: LoadTestReport, path: str | Path) -> Path:
    """Offered vs completed per step, and latency percentiles per step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report.steps
    rates = [s.rate for s in steps]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    ax1.plot(rates, [s.offered_per_s for s in steps], "o-", label="offered/s")
    ax1.plot(rates, [s.accepted_per_s for s in steps], "s--", label="accepted/s")
    ax1.plot(rates, [s.completed_per_s for s in steps], "^-", label="completed/s")
    for s in steps:
        ax1.annotate("PASS" if s.passed else "FAIL", (s.rate, s.completed_per_s), textcoords="offset points",
                     xytext=(0, 8), ha="center", fontsize=8, color="green" if s.passed else "red")
    ax1.set_xlabel("step (target tasks/s)")
    ax1.set_ylabel("tasks/s")
    ax1.set_title(f"throughput ({report.type}, sustained {report.sustained_rate or 0}/s)")
    ax1.grid(True, alpha=0.3)
    ax1.legend()
    for name, attr, style in (("dispatch", "dispatch_ms", "--"), ("end to end", "e2e_ms", "-")):
        for q in ("p50", "p95", "p99"):
            ys = [getattr(s, attr).get(q) for s in steps]
            ax2.plot(rates, [y if y is not None else float("nan") for y in ys], style, marker="o",
                     label=f"{name} {q}")
    ax2.set_yscale("log")
    ax2.set_xlabel("step (target tasks/s)")
    ax2.set_ylabel("latency (ms, log)")
    ax2.set_title("latency per step")
    ax2.grid(True, alpha=0.3, which="both")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def run_loadtest(options: LoadTestOptions, progress: Progress | None = None,
                 stop: threading.Event | None = None) -> LoadTestReport:
    return LoadTest(options, progress, stop).run()


def stderr_progress(stream: Any = None) -> Progress:
    """A progress printer: one rewritten line on a terminal, a line every few seconds otherwise."""
    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    state = {"last": 0.0, "width": 0}

    def show(line: str) -> None:
        if tty:
            pad = max(0, state["width"] - len(line))
            stream.write("\r" + line + " " * pad + ("\n" if not line else ""))
            state["width"] = len(line)
            stream.flush()
        elif line and time.monotonic() - state["last"] >= 5:
            state["last"] = time.monotonic()
            stream.write(line + "\n")
            stream.flush()

    return show
