"""``manage.py smsload``: seed 004's acceptance, the SMS demo stepped 50 -> 1,000 msg/s, every message accounted for.

Two processes, the way ``manage.py benchmark`` runs (``tools/benchmark.py``):

- the orchestrator (``manage.py smsload``) lets :class:`tools.benchmark.Bench`
  start a Redis (or use ``--redis-url``), the simulated supplier
  (``tools/sms_supplier.py``), migrate the database (``DATABASE_URL``; a scratch
  SQLite file when unset) and create the demo's types, ``bench.sms``
  (``sms.submit``, batched) and ``bench.sms_one`` (``sms.submit_one``, its
  unbatched twin); then, per mode, it starts the workers
  (``instances`` x ``celery -P pool -c concurrency``), runs the driver and
  stops them (by their own process group), and stops what it started;
- the driver (``manage.py smsload --role drive``, in that environment) runs
  the steps. Each step offers ``rate`` messages/s for ``step_seconds`` with the
  load test's open-loop generator (``tools/loadgen.py``: message *i* due at
  ``start + i/rate``, each with its own idempotency key), waits until every
  accepted message has its row or is a dead letter (``drain_limit_s``, plus
  ``settle_s`` before it gives up), then accounts for every message
  (``tools.loadcheck.check_rows``): one ``SmsMessage`` row per accepted
  message, no key twice, no row written by another task or for a key never
  accepted, and the supplier's count of the step's keys equal to the rows.

A step passes by the load test's strict rule (``tools.loadcheck.step_verdict``):
completions (rows written) during the step reach 97 % of offered, the backlog
at its end is under one second of offered load, it drains within the limit,
and everything is accounted for. ``sustained`` is the highest passing step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tasks.worker_groups import realtime_shape
from tools.benchmark import ROOT, SMS_TYPES, Bench, BenchOptions, cpu_seconds, machine_info
from tools.loadcheck import (
    Applied,
    RowWritten,
    Sent,
    StepLoad,
    check_rows,
    completed_between,
    percentiles,
    step_verdict,
    sustained,
)

#: The modes and the benchmark system (hence task type and lane) each drives.
MODES = {"batched": "batch", "single": "platform"}
EXIT_OK, EXIT_STEP_FAILED, EXIT_INCORRECT = 0, 1, 3
#: Most seconds the "completed during the step" window is shifted by the end-to-end latency (as the load test).
MAX_WINDOW_SHIFT_S = 1.0
#: Seconds between two polls of the rows while a step drains.
DRAIN_POLL_S = 0.2

Progress = Callable[[str], None]


def default_bench() -> BenchOptions:
    """The run's environment as ``manage.py benchmark`` makes it, shaped for the SMS demo.

    Its workers (``instances`` x ``celery -P io_pool -c io_concurrency``, the same
    for both modes) are the shape of ``make run``'s realtime group, read from its
    one definition (``tasks.worker_groups.realtime_shape``, with the same
    ``WORKER_*`` overrides): what the demo measures is what ``make run`` would
    run it on, and a change of ``make run``'s defaults moves both. One unbatched
    message holds a run thread for its supplier request (20 ms) and its two
    statements (a few ms more with fsync): 500 msg/s needs about 12-15 in flight.
    The supplier (``sms_channels`` the messages spread over,
    ``sms_tps`` messages/s per channel, ``sms_latency_ms`` per request),
    ``redis_url`` (None: start one) and ``database_url`` (None: a scratch SQLite file).
    """
    shape = realtime_shape()
    return BenchOptions(workloads=["sms"], instances=shape.instances, io_pool=shape.pool,
                        io_concurrency=shape.concurrency)


@dataclass
class SmsLoadOptions:
    #: The rates offered in turn (msg/s), each for ``step_seconds``.
    steps: list[int] = field(default_factory=lambda: [50, 100, 200, 300, 500, 1000])
    step_seconds: float = 15.0
    #: ``batched`` (``sms.submit``), ``single`` (``sms.submit_one``), or both, in that order.
    modes: list[str] = field(default_factory=lambda: ["batched"])
    #: Generator threads (the load test's open-loop senders); 0: per step, ``loadgen.senders_for(rate)``.
    senders: int = 0
    #: Seconds after a step within which every message must have its row; then seconds more before giving up.
    drain_limit_s: float = 10.0
    settle_s: float = 30.0
    #: False: run a mode's later steps after a failed one.
    stop_on_fail: bool = True
    #: > 0: delete 1 in N of each step's rows after it drained, before the check (proves the check fails).
    drop_rows_every: int = 0
    bench: BenchOptions = field(default_factory=default_bench)

    @classmethod
    def from_dict(cls, data: dict) -> SmsLoadOptions:
        return cls(**{**data, "bench": BenchOptions(**data["bench"])})


@dataclass
class SmsStep:
    rate: int  # the step's target, msg/s
    seconds: float = 0.0  # how long the load ran
    sent: int = 0  # dispatches made
    accepted: int = 0  # of which admission accepted
    offered_per_s: float = 0.0  # sent / seconds
    accepted_per_s: float = 0.0
    completed_during_per_s: float = 0.0  # distinct messages whose row was written during the step, per second
    backlog_at_end: int = 0  # accepted without a row when the step's load ended
    drained: bool = False
    drain_s: float | None = None
    rejections: dict[str, int] = field(default_factory=dict)
    dispatch_ms: dict[str, float | None] = field(default_factory=dict)
    e2e_ms: dict[str, float | None] = field(default_factory=dict)  # due time -> row written
    rows: int = 0  # rows of the step's keys
    supplier_accepted: int | None = None  # the supplier's count of the step's keys
    dropped: int = 0  # rows deleted by --drop-rows-every
    applied: int = 0
    dead: int = 0
    lost: int = 0
    duplicates: int = 0
    unknown: int = 0
    pending: int = 0  # accepted, no row, still held by the platform when the wait ended
    sql_per_msg: float | None = None  # statements the workers ran (the handler's and the platform's), per message
    #: Transactions the workers' connections committed or rolled back themselves (an ``atomic`` block's), per
    #: message: on PostgreSQL each is two round trips (``BEGIN``, ``COMMIT``) besides its statements.
    sql_transactions_per_msg: float | None = None
    redis_round_trips_per_msg: float | None = None
    #: CPU per accepted message (ms) from the step's start to its drain, by process: ``workers``, ``supplier``,
    #: ``redis``, ``postgres`` (the server's processes, when it runs on this host), ``driver`` (the generator).
    cpu_ms_per_msg: dict[str, float] = field(default_factory=dict)
    examples: dict[str, list] = field(default_factory=dict)
    correct: bool = True
    passed: bool = False
    why: str = ""


@dataclass
class ModeReport:
    mode: str
    type: str
    workers: str
    run: str = ""
    steps: list[SmsStep] = field(default_factory=list)
    sustained_rate: int | None = None
    error: str | None = None


@dataclass
class SmsLoadReport:
    options: dict
    machine: dict
    database: str = ""
    modes: list[ModeReport] = field(default_factory=list)
    #: Sustained batched / sustained single (``--mode both``; None when either sustained nothing).
    ratio: float | None = None
    exit_code: int = EXIT_OK
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SmsLoadReport:
        """A report saved with ``--json``, to print its tables again (``--show``)."""
        modes = [ModeReport(**{**m, "steps": [SmsStep(**s) for s in m["steps"]]}) for m in data["modes"]]
        return cls(**{**data, "modes": modes})


# -- the orchestrator ------------------------------------------------------
class SmsLoad:
    """Starts what the run needs, each mode's workers and driver in turn, and stops all of it."""

    def __init__(self, options: SmsLoadOptions, progress: Progress | None = None) -> None:
        self.o = options
        self.progress = progress or (lambda line: None)
        options.bench.workloads, options.bench.systems = ["sms"], [MODES[m] for m in options.modes]
        self.bench = Bench(options.bench, self.progress)

    def run(self) -> SmsLoadReport:
        started = time.monotonic()
        options = asdict(self.o)
        for name in ("database_url", "redis_url"):
            options["bench"][name] = _redacted(options["bench"][name])
        report = SmsLoadReport(options=options, machine=machine_info(),
                               database=_vendor(self.o.bench.database_url))
        self.progress(f"smsload: database {report.database}, load average {report.machine['loadavg_at_start']}")
        self.bench.setup()
        try:
            for mode in self.o.modes:
                report.modes.append(self._mode(mode))
        finally:
            self.bench.teardown()
        report.machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        finish(report)
        report.seconds = round(time.monotonic() - started, 1)
        return report

    def _mode(self, mode: str) -> ModeReport:
        system = MODES[mode]
        out = ModeReport(mode, SMS_TYPES[system], self.bench.describe_workers(system, "sms"))
        probe_dir = self.bench.tmp / f"probe-{mode}"
        self.progress(f"{mode}: starting workers ({out.workers}) for {out.type}")
        procs = []
        try:
            procs = self.bench.start_workers(system, "sms", probe_dir, self.bench.tmp / f"latency-{mode}")
            pids = {"workers": [p.pid for p in procs], "supplier": [self.bench.supplier.pid] if self.bench.supplier
                    else [], "redis": [self.bench.redis_pid] if self.bench.redis_pid else []}
            spec = {"mode": mode, "type": out.type, "probe_dir": str(probe_dir), "supplier": self.bench.env[
                "BENCH_SMS_URL"], "options": asdict(self.o), "pids": pids}
            result = self._drive(spec)
            out.run = result["run"]
            out.steps = [SmsStep(**s) for s in result["steps"]]
        except Exception as exc:  # noqa: BLE001 - one failed mode is reported, the other still runs
            out.error = f"{type(exc).__name__}: {exc}"
        finally:
            for p in procs:
                p.kill()  # the driver accounted for every message: no warm shutdown to wait for
            try:
                self.bench.client.flushdb()  # what a failed step left behind must not reach the next mode
            except Exception:  # noqa: BLE001 - the next mode fails loudly if Redis is gone
                pass
        out.sustained_rate = sustained([(s.rate, s.passed) for s in out.steps])
        return out

    def _drive(self, spec: dict) -> dict:
        o = self.o
        limit = 60 + len(o.steps) * (o.step_seconds + o.drain_limit_s + o.settle_s + 30)
        driver = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "smsload", "--role", "drive", "--spec", json.dumps(spec)],
            cwd=ROOT, env=self.bench.env, stdout=subprocess.PIPE, stderr=None, text=True, start_new_session=True)
        try:
            out, _ = driver.communicate(timeout=limit)
        except BaseException:
            _kill_group(driver)
            raise
        if driver.returncode != 0 or not out.strip():
            raise RuntimeError(f"the driver exited with {driver.returncode} (its errors are above)")
        return json.loads(out.strip().splitlines()[-1])


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=10)


def _redacted(url: str | None) -> str | None:
    """``url`` without its password: a report is meant to be shared."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def _vendor(url: str | None) -> str:
    if not url:
        return "sqlite (scratch file)"
    scheme = url.split(":", 1)[0]
    return {"postgres": "postgresql", "postgresql": "postgresql", "pgsql": "postgresql"}.get(scheme, scheme)


def finish(report: SmsLoadReport) -> None:
    """The ratio and the exit code from the modes' steps."""
    by_mode = {m.mode: m for m in report.modes}
    batched, single = by_mode.get("batched"), by_mode.get("single")
    if batched and single and batched.sustained_rate and single.sustained_rate:
        report.ratio = round(batched.sustained_rate / single.sustained_rate, 2)
    steps = [s for m in report.modes for s in m.steps]
    if any(not s.correct for s in steps):
        report.exit_code = EXIT_INCORRECT
    elif any(not s.passed for s in steps) or any(m.error for m in report.modes):
        report.exit_code = EXIT_STEP_FAILED


# -- the driver (its own process, in the run's environment) ----------------
def drive(spec: dict, progress: Progress | None = None) -> dict:
    """Run the steps of one mode; returns ``{"run": ..., "steps": [SmsStep as dicts]}``."""
    import django

    if not django.apps.apps.ready:  # pragma: no cover - manage.py has set Django up
        django.setup()
    o = SmsLoadOptions.from_dict(spec["options"])
    driver = _Driver(o, spec["mode"], spec["type"], spec["supplier"], spec.get("probe_dir"),
                     progress or (lambda line: None), spec.get("pids") or {})
    steps = []
    for index, rate in enumerate(o.steps):
        step = driver.step(index, rate)
        steps.append(asdict(step))
        if not step.passed and o.stop_on_fail:
            break
    return {"run": driver.run_id, "steps": steps}


class _Driver:
    def __init__(self, o: SmsLoadOptions, mode: str, type_name: str, supplier_url: str, probe_dir: str | None,
                 progress: Progress, pids: dict[str, list[int]]) -> None:
        self.o, self.mode, self.type_name, self.progress = o, mode, type_name, progress
        self.pids = pids
        self.postmaster = _postmaster()
        self.stats_url = supplier_url.rsplit("/", 1)[0] + "/stats"
        self.probe_dir = probe_dir
        self.run_id = f"sms-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}-{mode}"

    def step(self, index: int, rate: int) -> SmsStep:
        from tasks.dispatch import admit
        from tools import loadgen, probe

        o = self.o
        step = SmsStep(rate=rate)
        prefix = f"{self.run_id}-s{index}-"
        n = max(1, int(rate * o.step_seconds))
        plans: list[list[loadgen.Message]] = [[] for _ in range(o.senders if o.senders > 0 else
                                                                loadgen.senders_for(rate))]
        for i in range(n):
            key = f"{prefix}{i}"
            payload = {"to": f"+86138{i:08d}", "channel": f"ch{i % o.bench.sms_channels}",
                       "text": "verification code 1234"}
            # Each message is its own "chat" to the checker (no order among SMS); none is sent with a chat id.
            plans[i % len(plans)].append(loadgen.Message(i, self.type_name, key, 0, key, payload))
        results: list[Sent] = []
        before_probe = probe.read_dir(self.probe_dir) if self.probe_dir else {}
        before_cpu = self._cpu()
        self.progress(f"{self.mode} step {index + 1}/{len(o.steps)}: {rate}/s for {o.step_seconds:g}s ({n} messages)")
        start = time.time() + 0.05
        loadgen.send([loadgen.planned(p) for p in plans], admit=_admit_unscoped(admit), start=start, rate=rate,
                     record=lambda entry: results.append(Sent.from_entry(entry)), stop=threading.Event(),
                     retry_for=0, timeout=600, name="smsload-sender")
        end = time.time()
        sent = sorted(results, key=lambda s: s.scheduled_ms)
        accepted = [s for s in sent if s.accepted]
        step.seconds = round(end - start, 3)
        step.sent, step.accepted = len(sent), len(accepted)
        step.offered_per_s = round(len(sent) / max(1e-9, end - start), 1)
        step.accepted_per_s = round(len(accepted) / max(1e-9, end - start), 1)
        step.rejections = dict(Counter(s.reason or "?" for s in sent if not s.accepted))
        step.dispatch_ms = _rounded(percentiles([s.done_ms - s.scheduled_ms for s in sent]))

        step.drained, step.drain_s = self._drain(prefix, len(accepted), end)
        if accepted:
            after_cpu = self._cpu()
            step.cpu_ms_per_msg = {name: round(sum(s - before_cpu.get(name, {}).get(pid, 0.0) for pid, s in
                                                   by_pid.items()) * 1000 / len(accepted), 3)
                                   for name, by_pid in after_cpu.items()}
        if o.drop_rows_every > 0:
            step.dropped = _drop_rows([s.key for s in accepted][::o.drop_rows_every])
        rows, dead_ids = _rows(prefix), _dead_task_ids(prefix)
        if self.probe_dir and accepted:
            d = probe.diff(probe.read_dir(self.probe_dir), before_probe)
            step.sql_per_msg = round(d.get("sql_statements", 0) / len(accepted), 3)
            step.sql_transactions_per_msg = round((d.get("sql_commit", 0) + d.get("sql_rollback", 0)) / len(accepted),
                                                  3)
            step.redis_round_trips_per_msg = round(d.get("redis_round_trips", 0) / len(accepted), 2)
        step.rows = len(rows)
        step.supplier_accepted = self._supplier_count(prefix)
        row_keys = {r.key for r in rows}
        missing = [s.task_id for s in accepted if s.key not in row_keys and s.task_id and s.task_id not in dead_ids]
        verdict = check_rows(sent, rows, dead_ids, held=_held(missing))
        step.applied, step.dead, step.lost = verdict.applied, verdict.dead, verdict.lost
        step.duplicates, step.unknown = verdict.duplicates, verdict.unknown
        step.pending = verdict.report.stuck if verdict.report else 0
        step.examples = {k: v for k, v in {"lost": verdict.lost_keys, "duplicates": verdict.duplicate_keys}.items()
                         if v}

        log = [Applied(r.key, 0, r.at_ms, r.key) for r in sorted(rows, key=lambda r: r.at_ms)]
        due = {s.key: s.scheduled_ms for s in accepted}
        step.e2e_ms = _rounded(percentiles([r.at_ms - due[r.key] for r in rows if r.key in due]))
        accepted_keys = set(due)
        shift_s = min(MAX_WINDOW_SHIFT_S, (step.e2e_ms.get("p50") or 0.0) / 1000)
        in_window = completed_between(log, accepted_keys, (start + shift_s) * 1000, (end + shift_s) * 1000)
        step.completed_during_per_s = round(in_window / max(1e-9, end - start), 1)
        step.backlog_at_end = max(0, len(accepted) - completed_between(log, accepted_keys, start * 1000, end * 1000))

        ok, why = step_verdict(verdict, StepLoad(rate, step.offered_per_s, step.completed_during_per_s,
                                                 step.backlog_at_end, step.drained, step.drain_s, o.drain_limit_s))
        problems = [] if why == "ok" else [why]
        if step.supplier_accepted is not None and step.supplier_accepted != step.rows:
            step.correct = False
            problems.append(f"the supplier accepted {step.supplier_accepted} of the step's messages, "
                            f"{step.rows} rows")
        if step.pending:
            problems.append(f"{step.pending} still pending")
        step.correct = step.correct and verdict.clean
        step.passed = ok and not problems
        step.why = "; ".join(problems) or "ok"
        self.progress(f"{self.mode} {rate}/s: offered {step.offered_per_s:g}/s, done in step "
                      f"{step.completed_during_per_s:g}/s, rows {step.rows}/{step.accepted}, lost {step.lost}, "
                      f"{'PASS' if step.passed else 'FAIL: ' + step.why}")
        return step

    def _drain(self, prefix: str, accepted: int, end: float) -> tuple[bool, float | None]:
        """Wait until the step's accepted messages all have a row or a dead letter; (drained, s after the end)."""
        limit = end + self.o.drain_limit_s + self.o.settle_s
        while True:
            done = _count_rows(prefix) + _count_dead(prefix)
            now = time.time()
            if done >= accepted:
                return True, round(max(0.0, now - end), 3)
            if now > limit:
                return False, None
            time.sleep(DRAIN_POLL_S)

    def _cpu(self) -> dict[str, dict[int, float]]:
        """CPU seconds used so far by each process of each named group, this one's as ``driver``.

        By process, so a PostgreSQL backend that started since (a worker thread's first query) counts from zero.
        """
        times = os.times()
        groups = {name: pids for name, pids in self.pids.items() if pids}
        if self.postmaster is not None:
            groups["postgres"] = [self.postmaster, *_children(self.postmaster)]
        return {**{name: {pid: cpu_seconds(pid) for pid in pids} for name, pids in groups.items()},
                "driver": {os.getpid(): times.user + times.system}}

    def _supplier_count(self, prefix: str) -> int | None:
        try:
            with urllib.request.urlopen(f"{self.stats_url}?prefix={prefix}", timeout=10) as answer:
                return int(json.loads(answer.read())["accepted_with_prefix"])
        except (OSError, ValueError, KeyError):
            return None


def _admit_unscoped(admit: Callable[..., Any]) -> Callable[..., Any]:
    """``admit`` for the demo's types, which are not chat-scoped: the generator's chat id is not sent."""

    def call(task_type: str, payload: Any, *, chat_id: str | None = None, **options: Any) -> Any:
        return admit(task_type, payload, **options)

    return call


def _postmaster() -> int | None:
    """The PostgreSQL server's main process when it runs on this host (its backends are its children), else None."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    return _parents().get(backend)  # None: on another host (or in another PID namespace)


def _children(pid: int) -> list[int]:
    return [child for child, parent in _parents().items() if parent == pid]


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return parents


def _count_rows(prefix: str) -> int:
    from tools.models import SmsMessage

    return SmsMessage.objects.filter(key__startswith=prefix).count()


def _count_dead(prefix: str) -> int:
    from tasks.models import DeadLetter

    return DeadLetter.objects.filter(idempotency_key__startswith=prefix).count()


def _rows(prefix: str) -> list[RowWritten]:
    from tools.models import SmsMessage

    return [RowWritten(key, task_id, at.timestamp() * 1000) for key, task_id, at in
            SmsMessage.objects.filter(key__startswith=prefix).values_list("key", "task_id", "created_at")]


def _dead_task_ids(prefix: str) -> set[str]:
    from tasks.models import DeadLetter

    return set(DeadLetter.objects.filter(idempotency_key__startswith=prefix).values_list("task_id", flat=True))


def _drop_rows(keys: list[str]) -> int:
    from tools.models import SmsMessage

    dropped = 0
    for lo in range(0, len(keys), 500):
        dropped += SmsMessage.objects.filter(key__in=keys[lo:lo + 500]).delete()[0]
    return dropped


def _held(task_ids: list[str]) -> set[str]:
    """Of ``task_ids``, those the platform still holds (their record is neither done nor dead)."""
    from lanes import keys
    from lanes.redis_client import get_redis

    r = get_redis()
    held: set[str] = set()
    for lo in range(0, len(task_ids), 2000):
        batch = task_ids[lo:lo + 2000]
        pipe = r.pipeline(transaction=False)
        for task_id in batch:
            pipe.hget(keys.task_record(task_id), "st")
        held.update(t for t, st in zip(batch, pipe.execute(), strict=True) if st not in (b"done", b"dead", None))
    return held


def _rounded(values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: (round(v, 1) if v is not None else None) for k, v in values.items()}


# -- presentation ---------------------------------------------------------
TABLE_COLUMNS = ["mode", "rate", "offered/s", "done in step/s", "backlog at end", "drain s", "e2e p50/p95/p99 ms",
                 "rows", "supplier", "lost", "dup", "unknown", "dead", "sql/msg", "tx/msg", "cpu ms/msg", "result",
                 "why"]
#: The processes of the "cpu ms/msg" column, in its order (``SmsStep.cpu_ms_per_msg``).
CPU_COLUMNS = ("workers", "postgres", "supplier", "redis", "driver")
SIDE_BY_SIDE_COLUMNS = ["rate", "batched done/s", "single done/s", "batched/single", "batched", "single"]


def table_rows(report: SmsLoadReport) -> list[dict[str, Any]]:
    rows = []
    for m in report.modes:
        for s in m.steps:
            rows.append({
                "mode": m.mode, "rate": s.rate, "offered/s": s.offered_per_s,
                "done in step/s": s.completed_during_per_s, "backlog at end": s.backlog_at_end,
                "drain s": s.drain_s if s.drained else "no", "e2e p50/p95/p99 ms": _triple(s.e2e_ms),
                "rows": f"{s.rows}/{s.accepted}", "supplier": s.supplier_accepted, "lost": s.lost,
                "dup": s.duplicates, "unknown": s.unknown, "dead": s.dead, "sql/msg": s.sql_per_msg,
                "tx/msg": s.sql_transactions_per_msg, "cpu ms/msg": _cpu_text(s.cpu_ms_per_msg),
                "result": "PASS" if s.passed else "FAIL", "why": s.why,
            })
        if m.error:
            rows.append({"mode": m.mode, "result": "ERROR", "why": m.error})
    return rows


def side_by_side(report: SmsLoadReport) -> list[dict[str, Any]]:
    """Per rate, the two modes' completions during the step and their ratio (``--mode both``)."""
    by_mode = {m.mode: {s.rate: s for s in m.steps} for m in report.modes}
    if set(by_mode) != set(MODES):
        return []
    rows = []
    for rate in report.options["steps"]:
        b, s = by_mode["batched"].get(rate), by_mode["single"].get(rate)
        rows.append({
            "rate": rate, "batched done/s": b.completed_during_per_s if b else None,
            "single done/s": s.completed_during_per_s if s else None,
            "batched/single": round(b.completed_during_per_s / s.completed_during_per_s, 2)
            if b and s and s.completed_during_per_s else None,
            "batched": ("PASS" if b.passed else "FAIL") if b else "not run",
            "single": ("PASS" if s.passed else "FAIL") if s else "not run",
        })
    return rows


def summary(report: SmsLoadReport) -> str:
    parts = [f"{m.mode} ({m.type}, {m.workers}): sustained {m.sustained_rate or 0} msg/s" for m in report.modes]
    if report.ratio is not None:
        parts.append(f"batched/single {report.ratio:g}x")
    return f"database {report.database}; " + "; ".join(parts)


def _cpu_text(cpu: dict[str, float]) -> str:
    """``workers 1.20 postgres 0.90 ...``: what each group of processes spent a message, in CPU_COLUMNS order."""
    return " ".join(f"{name} {cpu[name]:.2f}" for name in CPU_COLUMNS if name in cpu) or "-"


def _triple(p: dict[str, float | None]) -> str:
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"
    return "/".join(f(p.get(k)) for k in ("p50", "p95", "p99"))


def default_database_url() -> str | None:
    """The configured database (``DATABASE_URL``), or None for a scratch SQLite file."""
    return os.environ.get("DATABASE_URL") or None

