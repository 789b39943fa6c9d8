"""The ``loadtest.sink`` handler: simulated outbound I/O that records what it applied, for verification.

The load test checks the record afterwards: every accepted message applied
once, in dispatch order per chat. The record is keyed by run id and expires.
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
from tasks.registry import Context, handler

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
    record_applied(run, key, f"{ctx.chat_id}\t{seq}\t{now_ms}\t{key}")
    return {"applied": True}


# --- the record: one Lua call (sink_record.lua, beside this module) -----------

SCRIPT_PATH = Path(__file__).with_name("sink_record.lua")
_scripts: dict[int, Script] = {}


def record_applied(run: str, key: str, line: str, ttl_s: int = RECORD_TTL_S,
                   max_entries: int = RECORD_MAX_ENTRIES) -> None:
    """Count ``key`` as applied and append ``line`` to the run's log, in one round trip (sink_record.lua)."""
    client = get_redis()
    script = _scripts.get(id(client))
    if script is None:
        script = _scripts[id(client)] = client.register_script(SCRIPT_PATH.read_text())
    _call_lean(script, [applied_key(run), log_key(run)], [key, line, ttl_s, max_entries])


def _call_lean(script: Script, keys_: Sequence[Any], args: Sequence[Any]) -> Any:
    """EVALSHA on a pooled connection, EVAL when Redis lost the script: the lean path of ``lanes.scripts.call``.

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
