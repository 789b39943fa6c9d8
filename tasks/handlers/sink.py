"""``loadtest.sink``: simulated outbound I/O that records what it applied, for verification.

The load test checks the record afterwards: every accepted message applied
once, in dispatch order per chat. The record is keyed by run id and expires.
"""

from __future__ import annotations

import random
import time
from typing import Any

from lanes import keys, scripts
from lanes.forksafe import ForkSafeLock
from tasks.errors import RetryableError
from tasks.registry import handler

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
def sink(payload: dict, ctx: Any) -> dict:
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
    scripts.call("sink_record", [applied_key(run), log_key(run)],
                 [key, f"{ctx.chat_id}\t{seq}\t{now_ms}\t{key}", RECORD_TTL_S, RECORD_MAX_ENTRIES])
    return {"applied": True}
