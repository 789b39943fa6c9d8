"""The ``loadtest.sink`` handlers: simulated outbound I/O that records what it applied, for verification.

The load test checks the record afterwards: every accepted message applied
once, in dispatch order per chat. The record is keyed by run id and expires.
``loadtest.sink_batch`` is the batched twin: one simulated I/O wait
per batch, the same record per item, and a count of its calls per run.
Registered by the tools app's ``ready()`` only, so a production install
(``DISPATCH_PROFILE=production``, tools left out) has no such handler.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

from lanes import keys
from lanes.forksafe import ForkSafeLock
from lanes.redis_client import get_redis
from tasks.errors import RetryableError
from tasks.registry import BatchItem, Context, handler

#: Seconds a run's record of applied messages is kept.
RECORD_TTL_S = 3600
#: Most applied keys and log lines kept per run (far above any load-test step).
RECORD_MAX_ENTRIES = 2_000_000
#: Most runs whose per-process counts (``drop_every``) are remembered.
MAX_COUNTED_RUNS = 1000


def applied_key(run: str) -> str:
    return f"{keys.PREFIX}sink:{run}:applied"


def log_key(run: str) -> str:
    return f"{keys.PREFIX}sink:{run}:log"


def calls_key(run: str) -> str:
    """Calls of the batched sink for ``run`` (one per batch; per run, as a batch may span runs)."""
    return f"{keys.PREFIX}sink:{run}:calls"


_counts_lock = ForkSafeLock()
_counts: dict[str, int] = {}


def _nth_of_run(run: str) -> int:
    with _counts_lock:
        if run not in _counts and len(_counts) >= MAX_COUNTED_RUNS:
            _counts.clear()
        n = _counts[run] = _counts.get(run, 0) + 1
        return n


@handler("loadtest.sink")
def sink(payload: dict, ctx: Context) -> dict:
    """Sleep ``latency_ms``, fail retryably at ``fail_rate``, else record (chat, seq, key) as applied."""
    started_ms = _first_start_ms(ctx)
    latency_ms = float(payload.get("latency_ms", 0) or 0)
    if latency_ms > 0:
        time.sleep(min(latency_ms, 10_000) / 1000)
    if random.random() < float(payload.get("fail_rate", 0) or 0):
        raise RetryableError("simulated outbound failure")
    run = str(payload.get("run", "default"))
    now_ms = int(time.time() * 1000)
    drop_every = int(payload.get("drop_every", 0) or 0)
    seq = int(payload.get("seq", 0))
    key = ctx.idempotency_key
    if drop_every > 0 and _nth_of_run(run) % drop_every == 0:
        # A deliberately broken sink: every drop_every-th message this process
        # handles for the run is "applied" without a trace. Proves the checker can fail.
        return {"applied": False}
    record_applied(run, key, f"{ctx.chat_id}\t{seq}\t{now_ms}\t{key}\t{started_ms}")
    return {"applied": True}


@handler("loadtest.sink_batch", batch=True)
def sink_batch(items: list[BatchItem]) -> list[Any]:
    """loadtest.sink for a batch: one ``latency_ms`` wait per call; each item fails or is recorded on its own."""
    started = time.time()
    latency_ms = max((float(p.get("latency_ms", 0) or 0) for p, _ in items), default=0.0)
    if latency_ms > 0:
        time.sleep(min(latency_ms, 10_000) / 1000)
    outcomes: list[Any] = []
    records: dict[str, list[tuple[str, str]]] = {}
    for payload, ctx in items:
        run = str(payload.get("run", "default"))
        records.setdefault(run, [])  # a call is counted even when every item of it failed
        if random.random() < float(payload.get("fail_rate", 0) or 0):
            outcomes.append(RetryableError("simulated outbound failure"))
            continue
        drop_every = int(payload.get("drop_every", 0) or 0)
        if drop_every > 0 and _nth_of_run(run) % drop_every == 0:
            outcomes.append({"applied": False})  # as the single sink: the checker must catch it
            continue
        key = ctx.idempotency_key
        records[run].append((key, f"{ctx.chat_id}\t{int(payload.get('seq', 0))}\t{int(time.time() * 1000)}\t{key}"
                                  f"\t{_first_start_ms(ctx, started)}"))
        outcomes.append({"applied": True})
    for run, entries in records.items():
        record_applied_many(run, entries)
    return outcomes


def _first_start_ms(ctx: Context, started: float | None = None) -> str:
    """When the handler began (epoch ms), on a first attempt only: the load test's enqueue->start."""
    return f"{(time.time() if started is None else started) * 1000:.3f}" if ctx.attempt == 1 else ""


# --- the record: one Lua call (sink_record.lua / sink_record_batch.lua, beside this module) ----

SCRIPT_PATH = Path(__file__).with_name("sink_record.lua")
BATCH_SCRIPT_PATH = Path(__file__).with_name("sink_record_batch.lua")
_scripts: dict[tuple[int, Path], Script] = {}


def _script(path: Path) -> Script:
    client = get_redis()
    script = _scripts.get((id(client), path))
    if script is None:
        script = _scripts[(id(client), path)] = client.register_script(path.read_text())
    return script


def record_applied(run: str, key: str, line: str, ttl_s: int = RECORD_TTL_S,
                   max_entries: int = RECORD_MAX_ENTRIES) -> None:
    """Count ``key`` as applied and append ``line`` to the run's log, in one round trip (sink_record.lua)."""
    _call_lean(_script(SCRIPT_PATH), [applied_key(run), log_key(run)], [key, line, ttl_s, max_entries])


def record_applied_many(run: str, entries: Sequence[tuple[str, str]], ttl_s: int = RECORD_TTL_S,
                        max_entries: int = RECORD_MAX_ENTRIES) -> None:
    """Record each (key, line) as ``record_applied`` would and count one handler call, in one round trip."""
    args: list[Any] = [ttl_s, max_entries]
    for key, line in entries:
        args += [key, line]
    _call_lean(_script(BATCH_SCRIPT_PATH), [applied_key(run), log_key(run), calls_key(run)], args)


def _call_lean(script: Script, keys_: Sequence[Any], args: Sequence[Any]) -> Any:
    """EVALSHA on a pooled connection, EVAL when Redis lost the script: the lean path of ``lanes.lua.loader.call``.

    The record is the load test's own verification, not the simulated work, so
    it costs the worker as little client CPU as the platform's own scripts do.
    """
    pool = script.registered_client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command("EVALSHA", script.sha, len(keys_), *keys_, *args)
        try:
            return conn.read_response()
        except NoScriptError:
            conn.send_command("EVAL", script.script, len(keys_), *keys_, *args)
            return conn.read_response()
    finally:
        pool.release(conn)
