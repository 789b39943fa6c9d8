"""What every fault scenario shares: its own Redis, workers, the load generator, the drain, the check.

A ``FaultCluster`` owns a redis-server of its own (own port, own AOF folder, so
it can be killed, paused and restarted without touching the session's), the
workers pointed at it through ``REDIS_URL``, and the load generator
subprocesses. ``close()`` stops everything it started, by PID or by the process
group it created, and copies logs to ``test-artifacts/``. A scenario that failed
keeps its evidence first (``keep_evidence``, called by tests/faults/conftest.py
before the teardown): its Redis data, every log and the checker's per-chat
timeline, in ``test-artifacts/evidence/<test>-<cluster>/``, a folder the failure
message names (CI keeps ``test-artifacts/`` as the run's output).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from lanes import keys
from tests.support.helpers import define, unique
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, Worker, start_all
from tools.loadcheck import Delivery, Op, Report, check

LONG = os.environ.get("FAULTS_LONG") == "1"
ARTIFACTS = ROOT / "test-artifacts"
#: Where a failed scenario's evidence goes (one folder per cluster of the test).
EVIDENCE = ARTIFACTS / "evidence"


def long_only(why: str):
    """A scenario run by ``make faults`` only (each costs 15-35 s; ``make test`` stays under 20 minutes)."""
    return pytest.mark.skipif(not LONG, reason=f"long campaign only (make faults): {why}")


def pick(short, long):
    """The short campaign's value (``make test``) or the long one's (``make faults``)."""
    return long if LONG else short


class LoadRun:
    """One load generator subprocess and its history file."""

    def __init__(self, cluster: FaultCluster, spec: dict) -> None:
        self.spec = spec
        name = unique("load")
        self.spec_path = cluster.dir / f"{name}.json"
        self.history_path = cluster.dir / f"{name}.jsonl"
        self.log_path = cluster.dir / f"{name}.log"
        self.spec_path.write_text(json.dumps(spec))
        self.started = time.time()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.loadgen", str(self.spec_path), str(self.history_path)],
            cwd=ROOT, env={**os.environ, **cluster.env}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.ended: float | None = None

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"load generator still running after {timeout}s; log: {self.log_path}") from None
        self.ended = time.time()
        assert self.proc.returncode == 0, f"load generator failed; log:\n{self.log_path.read_text()[-3000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.ended = self.ended or time.time()

    def entries(self) -> list[dict]:
        if not self.history_path.exists():
            return []
        return [json.loads(line) for line in self.history_path.read_text().splitlines() if line.strip()]

    def dispatched_at(self) -> dict[str, float]:
        """When each message's dispatch was sent, by key (for the checker's per-chat timeline)."""
        return {e["key"]: float(e["t"]) for e in self.entries() if "key" in e and "t" in e}

    def ops(self) -> list[Op]:
        return [Op(e["chat"], e["seq"], e["key"], e["accepted"], e["task_id"], e["reason"], e["kind"])
                for e in self.entries()]


class FaultCluster:
    def __init__(self, tmp: Path, sink=None, *, appendfsync: str = "always", env: dict | None = None) -> None:
        self.dir = tmp / unique("faults")
        self.dir.mkdir(parents=True)
        self.redis = RedisServer(self.dir / "redis", secrets.token_urlsafe(12), appendfsync=appendfsync)
        self.sink = sink
        # The test suite's lease (6 s) and the production ratio of queued lease to lease (60:30).
        self.env = {"REDIS_URL": self.redis.url, "DISPATCH_LEASE_S": "6", "DISPATCH_QUEUED_LEASE_S": "12",
                    **(env or {})}
        self.workers: list[Worker] = []
        self.loads: list[LoadRun] = []
        self.types: list[str] = []
        self.paused = False
        #: What the last ``drain_and_check`` saw (ops, deliveries, dead letters, dispatch times, report).
        self.checked: dict | None = None

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> FaultCluster:
        self.redis.start()
        return self

    def close(self) -> None:
        for load in self.loads:
            load.stop()
        if self.paused:
            self.redis_resume()
        # The scenario is over and its Redis goes with it: kill, no warm shutdown (2-3 s a prefork worker).
        for worker in self.workers:
            worker.discard()
        self.redis.stop(kill=True)
        ARTIFACTS.mkdir(exist_ok=True)
        for log in [*(w.log_path for w in self.workers), *(ld.log_path for ld in self.loads),
                    self.dir / "redis" / "redis.log"]:
            if log.exists():
                shutil.copy(log, ARTIFACTS / f"{self.dir.name}-{log.name}")

    def keep_evidence(self, test_name: str) -> Path:
        """Copy what a failed scenario leaves, before its Redis and processes go: the Redis data
        (an RDB written by SAVE beside the AOF, either of which ``redis-server --dir`` loads), the
        workers' and load generators' logs and histories, the checker's per-chat timeline and the
        Redis state of every chat still holding something. Returns the folder."""
        folder = EVIDENCE / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', test_name)}-{self.dir.name}"
        folder.mkdir(parents=True, exist_ok=True)
        notes = []
        if self.paused:
            self.redis_resume()
        state: dict = {}
        if self.redis.proc is not None and self.redis.proc.poll() is None:
            try:
                c = self.client()
                state = redis_state(c, self.checked)
                c.save()
                notes.append("redis/dump.rdb written by SAVE at the failure; redis/appendonly* is the AOF")
            except redis.RedisError as exc:
                notes.append(f"Redis did not answer at the failure ({exc!r}): only its files are kept")
        else:
            notes.append("Redis was not running at the failure: its AOF as it was left")
        data = self.redis.data_dir
        if data.exists():
            shutil.copytree(data, folder / "redis", dirs_exist_ok=True)
        logs = folder / "logs"
        logs.mkdir(exist_ok=True)
        for path in [*(w.log_path for w in self.workers), *(p for ld in self.loads
                                                           for p in (ld.log_path, ld.history_path, ld.spec_path))]:
            if path.exists():
                shutil.copy(path, logs / path.name)
        if self.checked is not None:
            (folder / "timeline.json").write_text(json.dumps(chat_timeline(self.checked), indent=1, default=str))
            (folder / "report.json").write_text(json.dumps(self.checked["report"].as_dict(), indent=1, default=str))
        else:
            notes.append("the scenario failed before its drain and check: no timeline")
        (folder / "redis-state.json").write_text(json.dumps(state, indent=1, default=str))
        (folder / "README.txt").write_text("\n".join([
            f"Evidence of the failed fault scenario {test_name} (cluster {self.dir.name}).", *notes,
            "Load it: redis-server --port 6399 --dir redis --appendonly yes (the AOF), or",
            "--appendonly no (dump.rdb); the data holds no password: give it one with --requirepass.",
            "timeline.json: per chat, each accepted message in order (dispatched at, deliveries, dead reason,",
            "held in Redis); redis-state.json: the records, chat queues, leases and in-hand sets found.", ""]))
        return folder

    def dump_stacks(self) -> None:
        """Every live worker process writes its threads' stacks to its log (SIGUSR2), for the report."""
        for worker in self.workers:
            worker.dump_stacks()
        time.sleep(1.0)

    def client(self) -> redis.Redis:
        return self.redis.client()

    # -- configuration ---------------------------------------------------------
    def define(self, type_name: str, **fields) -> None:
        """Define a task type in the database; running processes see it at their next call."""
        define(type_name, **fields)
        self.types.append(type_name)
        if self.redis.proc is not None:
            self.client().incr(keys.CONFIG_VERSION)

    def http_type(self, lane: str, *, chat_queue_size: int = 256, **fields) -> str:
        name = unique("f-http")
        fields.setdefault("policy", {"max_retries": 8, "initial_backoff": 0.2, "multiplier": 2.0, "max_backoff": 2.0,
                                     "jitter": 0.2})
        self.define(name, handler="http.post", lane=lane, chat_scoped=True, chat_queue_size=chat_queue_size,
                    options={"url": self.sink.url}, timeout=600, **{"attempt_timeout": 10, **fields})
        return name

    # -- processes ---------------------------------------------------------------
    def worker(self, queues: str, *, pool: str = "prefork", concurrency: int = 2, env: dict | None = None,
               extra: list[str] | None = None, host: str | None = None) -> Worker:
        """Start a worker; ``host`` puts it on a simulated host (its node name and owner ids say
        ``host``, and its processes vouch only for processes of that host)."""
        return self.workers_at_once(queues, [{"pool": pool, "concurrency": concurrency, "env": env, "extra": extra,
                                              "host": host}])[0]

    def workers_at_once(self, queues: str, specs: list[dict]) -> list[Worker]:
        """Start one worker per spec (``worker``'s keyword arguments), all at once; each ready on return."""
        made = [Worker(queues, self.dir / "logs", pool=spec.get("pool", "prefork"),
                       concurrency=spec.get("concurrency", 2), env={**self.env, **(spec.get("env") or {})},
                       extra=spec.get("extra"), host=spec.get("host")) for spec in specs]
        self.workers.extend(made)
        return start_all(made)

    def load(self, spec: dict) -> LoadRun:
        run = LoadRun(self, spec)
        self.loads.append(run)
        return run

    def constant_load(self, type_name: str, *, rate: float, duration: float, chats: int, threads: int = 8,
                      retry_for: float = 60, mix: list[dict] | None = None) -> LoadRun:
        return self.load({"run": unique("r"), "chats": chats, "rate": rate, "duration": duration,
                          "threads": threads, "retry_for": retry_for,
                          "mix": mix or [{"kind": "ok", "type": type_name, "weight": 1, "payload": {}}]})

    @staticmethod
    def kill_main(worker: Worker) -> None:
        """SIGKILL the worker's main process only; its pool children are orphaned."""
        os.kill(worker.pid, signal.SIGKILL)
        worker.proc.wait(timeout=10)

    @staticmethod
    def reap(worker: Worker) -> None:
        """SIGKILL whatever is left of a worker's process group (orphaned pool children)."""
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_host(self, host: str) -> list[Worker]:
        """SIGKILL every process of every worker on simulated ``host`` at once (a host lost)."""
        victims = [w for w in self.workers if w.host == host and w.alive()]
        for worker in victims:
            try:
                os.killpg(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for worker in victims:
            worker.proc.wait(timeout=10)
        return victims

    def redis_kill(self) -> None:
        self.redis.stop(kill=True)

    def redis_restart(self) -> None:
        self.redis.start()

    def redis_pause(self) -> None:
        os.kill(self.redis.proc.pid, signal.SIGSTOP)
        self.paused = True

    def redis_resume(self) -> None:
        os.kill(self.redis.proc.pid, signal.SIGCONT)
        self.paused = False

    def sweep_republished(self) -> int:
        """Messages the workers' recovery sweep had to republish (lease ran out or copy gone)."""
        total = 0
        for worker in self.workers:
            for match in re.finditer(r"sweep_republished count=(\d+)", worker.log_text()):
                total += int(match.group(1))
        return total

    # -- state ---------------------------------------------------------------------
    def residue(self, lanes: list[str]) -> dict[str, int]:
        """What the platform still holds in Redis for ``lanes`` (all zero once drained)."""
        c = self.client()
        out = {
            "lane_messages": sum(c.llen(q) for lane in lanes for q in keys.lane_queues(lane)),
            "delayed": sum(c.zcard(keys.lane_delayed(lane)) for lane in lanes),
            "leases": c.zcard(keys.LEASES),
            "chat_keys": sum(1 for _ in c.scan_iter(keys.PREFIX + "chat:{*", count=1000)),
            "unacked": c.hlen("unacked"),
            # kombu's restore mutex: left held, no worker returns unacked messages to their queue
            "unacked_mutex_ttl_s": max(0, c.ttl("unacked_mutex")),
        }
        return {k: v for k, v in out.items() if v}

    def held(self, ops: list[Op]) -> set[str]:
        """Task ids of accepted ops whose record still exists in Redis (stuck, not lost)."""
        c = self.client()
        pipe = c.pipeline(transaction=False)
        accepted = [op for op in ops if op.accepted]
        for op in accepted:
            pipe.exists(keys.task_record(op.task_id, op.chat))
        return {op.task_id for op, found in zip(accepted, pipe.execute(), strict=True) if found}


def dead_letters(types: list[str]) -> dict[str, str]:
    from tasks.models import DeadLetter

    return dict(DeadLetter.objects.filter(task_type__in=types).values_list("task_id", "reason"))


def deliveries(sink, run_prefixes: list[str]) -> list[Delivery]:
    with sink.lock:
        attempts = list(sink.attempts)
    out = []
    for a in attempts:
        if not any(a.key.startswith(p + ":") for p in run_prefixes):
            continue
        seq = a.body.get("seq")
        out.append(Delivery(a.key, a.headers.get("X-Dispatch-Task-Id", ""), a.chat,
                            seq if isinstance(seq, int) else None, a.status, a.started, a.at))
    return out


def _settle(cluster: FaultCluster, lanes: list[str], settle: float) -> None:
    """Give late redeliveries ``settle`` s to show, or less once Redis holds nothing that could deliver.

    A task's record carries its message under a lease from the dispatch until its result row is
    stored (``lanes/transport.py``): a copy a worker holds in memory runs only if its claim finds the
    record. With no lease left (no live record), no queued or delayed message and nothing in kombu's
    unacked hash (Celery's own tasks), no copy can run again. Redis must stay so over two polls
    ``SETTLE_POLL_S`` apart; while anything is held the full ``settle`` is paid, as before.
    """
    end = time.time() + settle
    quiet = 0
    while time.time() < end:
        quiet = quiet + 1 if not cluster.residue(lanes) else 0
        if quiet >= 2:
            return
        time.sleep(min(SETTLE_POLL_S, max(0.0, end - time.time())))


SETTLE_POLL_S = 0.25


def drain_and_check(cluster: FaultCluster, loads: list[LoadRun], *, scenario: str, drain_bound: float,
                    lanes: list[str], settle: float = 2.0, residue_wait: float = 20.0) -> Report:
    """Wait until every accepted message is applied or dead (within ``drain_bound`` s of the load's
    end), let late redeliveries show for ``settle`` s, then run the checker."""
    sink = cluster.sink.sink
    ops = [op for load in loads for op in load.ops()]
    runs = [load.spec["run"] for load in loads if "run" in load.spec]
    load_end = max((load.ended or time.time()) for load in loads)
    accepted = [op for op in ops if op.accepted]
    deadline = load_end + drain_bound
    drain_s = None
    gone_twice = 0
    while True:
        with sink.lock:
            applied = {k for k, n in sink.applied.items() if n}
        dead = dead_letters(cluster.types)
        pending = [op for op in accepted if op.key not in applied and op.task_id not in dead]
        if not pending:
            drain_s = round(max(0.0, time.time() - load_end), 1)
            break
        # Pending tasks of which Redis keeps no record can never finish (lost): stop waiting
        # once that has been seen three times in a row.
        gone_twice = gone_twice + 1 if not cluster.held(pending) else 0
        if gone_twice >= 3:
            drain_s = round(max(0.0, time.time() - load_end), 1)  # all that could finish did
            break
        if time.time() > deadline:
            cluster.dump_stacks()
            break
        time.sleep(0.5)
    residue_deadline = time.time() + residue_wait
    while cluster.residue(lanes) and time.time() < residue_deadline:
        time.sleep(0.5)
    _settle(cluster, lanes, settle)
    dead = dead_letters(cluster.types)
    seen = deliveries(sink, runs)
    report = check(ops, seen, dead, scenario=scenario, held=cluster.held(ops))
    report.drain_s = drain_s
    cluster.checked = {"ops": ops, "deliveries": seen, "dead": dead, "report": report,
                       "dispatched_at": {k: t for load in loads for k, t in load.dispatched_at().items()}}
    repaired = {k.decode().split("|", 1)[1]: int(v) for k, v in cluster.client().hgetall(keys.METRICS_TOTAL).items()
                if k.startswith(b"chats_repaired|")}
    if repaired:  # the chat audit moved a stuck chat on: a defect somewhere else, even when nothing was stuck
        report.extra["chats_repaired"] = repaired
    residue = cluster.residue(lanes)
    if residue:
        report.notes.append(f"left in Redis after the drain: {residue}")
        report.extra["residue"] = residue
    return report


def chat_timeline(checked: dict) -> dict:
    """The checker's view per chat: each accepted (or unknown) message in sequence with when it was
    dispatched, its deliveries and its end; chats with a message neither applied nor dead come first."""
    report, dead, at = checked["report"], checked["dead"], checked["dispatched_at"]
    by_key: dict[str, list[Delivery]] = {}
    for d in checked["deliveries"]:
        by_key.setdefault(d.key, []).append(d)
    chats: dict[str, list[dict]] = {}
    for op in sorted(checked["ops"], key=lambda o: (o.chat, o.seq)):
        if op.accepted is False:
            continue
        ds = sorted(by_key.get(op.key, []), key=lambda d: d.started)
        applied = any(200 <= d.status < 300 for d in ds)
        chats.setdefault(op.chat, []).append({
            "seq": op.seq, "key": op.key, "task_id": op.task_id, "accepted": op.accepted, "kind": op.kind,
            "dispatched_at": at.get(op.key), "dead": dead.get(op.task_id),
            "end": "applied" if applied else f"dead:{dead[op.task_id]}" if op.task_id in dead else "none",
            "deliveries": [{"task_id": d.task_id, "started": round(d.started, 3), "ended": round(d.ended, 3),
                            "status": d.status} for d in ds]})
    unfinished = sorted(chat for chat, msgs in chats.items() if any(m["end"] == "none" and m["accepted"]
                                                                  for m in msgs))
    ordered = unfinished + sorted(set(chats) - set(unfinished))
    return {"summary": report.summary(), "unfinished_chats": unfinished,
            "chats": {chat: chats[chat] for chat in ordered}}


def redis_state(c: redis.Redis, checked: dict | None, most: int = 50) -> dict:
    """What Redis holds for the chats of unfinished messages (or every chat's queue when nothing was
    checked yet): each chat queue and its records, their leases, the processes and their in-hand sets."""
    chats: set[str] = set()
    if checked is not None:
        timeline = chat_timeline(checked)
        chats.update(timeline["unfinished_chats"])
    else:
        for key in c.scan_iter(keys.PREFIX + "chat:{*}:q", count=1000):
            chats.add(key.decode().split("{", 1)[1].rsplit("}", 1)[0])
    out: dict = {"chats": {}, "leases": {}, "procs": {}, "in_hand": {}}
    for chat in sorted(chats)[:most]:
        queue = [t.decode() for t in c.lrange(keys.chat_queue(chat), 0, -1)]
        records = {}
        for task_id in queue[:most]:
            record = keys.task_record(task_id, chat)
            fields = {k.decode(): v.decode(errors="replace") for k, v in c.hgetall(record).items() if k != b"msg"}
            records[task_id] = {**fields, "lease_until_ms": c.zscore(keys.LEASES, record)}
        out["chats"][chat] = {"queue": queue, "records": records}
    out["leases"] = {k.decode(): v for k, v in c.zrange(keys.LEASES, 0, 200, withscores=True)}
    out["procs"] = {k.decode(): v for k, v in c.zrange(keys.PROCS, 0, -1, withscores=True)}
    for proc in list(out["procs"])[:most]:
        out["in_hand"][proc] = sorted(m.decode() for m in c.smembers(keys.process_in_hand(proc)))
    out["time_ms"] = int(c.time()[0]) * 1000
    return out
