from __future__ import annotations

import os
import time
from typing import Any

from tasks.errors import NonRetryableError, RetryableError
from tasks.history import InvalidProgress
from tasks.registry import BatchItem, Context, handler


@handler("demo.echo")
def echo(payload: dict, ctx: Context) -> dict:
    """Return the payload; sleeps ``payload["sleep"]`` seconds first if given."""
    _sleep(payload)
    return payload


@handler("demo.flaky")
def flaky(payload: dict, ctx: Context) -> dict:
    """Like demo.echo, but fails on request: for trying retries and dead letters.

    ``payload["fail"]``: ``"retry"`` fails retryably while ``ctx.attempt <=
    payload.get("fail_times", 1)``; ``"fatal"`` fails for good; ``"crash"`` kills
    the worker process (a poison message); ``"exit"`` raises SystemExit;
    ``"unserializable"`` returns a value that is not JSON.
    """
    _sleep(payload)
    mode = payload.get("fail")
    if mode == "retry" and ctx.attempt <= int(payload.get("fail_times", 1)):
        raise RetryableError(f"asked to fail attempt {ctx.attempt}", retry_after_s=payload.get("retry_after"))
    if mode == "fatal":
        raise NonRetryableError("asked to fail for good")
    if mode == "crash":
        os._exit(13)
    if mode == "exit":
        raise SystemExit(3)
    if mode == "unserializable":
        return {"a set": {1, 2}}
    return payload


@handler("demo.progress")
def progress(payload: dict, ctx: Context) -> dict:
    """Report progress in ``payload["steps"]`` steps (default 10), ``payload["sleep"]`` seconds apart.

    ``payload["note"]`` is each step's note (default "step i of n"); ``payload["bad"]``
    reports that value instead and returns the refusal's message (for trying the checks).
    """
    if "bad" in payload:
        try:
            ctx.progress(payload["bad"], payload.get("note"))
        except InvalidProgress as exc:
            return {"refused": str(exc)}
        return {"refused": None}
    steps = max(1, min(int(payload.get("steps", 10)), 10_000))
    for i in range(1, steps + 1):
        _sleep(payload)
        ctx.progress(i / steps, payload.get("note") or f"step {i} of {steps}")
    return {"steps": steps}


def _sleep(payload: dict) -> None:
    sleep = payload.get("sleep")
    if isinstance(sleep, (int, float)) and not isinstance(sleep, bool) and sleep > 0:
        time.sleep(min(float(sleep), 3600.0))


@handler("demo.echo_batch", batch=True)
def echo_batch(items: list[BatchItem]) -> list[Any]:
    """Batched demo.echo (the batched no-op of the benchmark): each item's outcome is its payload.

    Per item, ``payload["fail"]``: ``"retry"`` (while ``ctx.attempt <= fail_times``,
    default 1) or ``"fatal"`` makes that item's outcome the error. Any item with
    ``payload["short_by"] = n`` makes the call return ``n`` outcomes too few (a
    mistake the platform must name); ``"raise"`` makes the whole call raise.
    """
    outcomes: list[Any] = []
    for payload, ctx in items:
        mode = payload.get("fail")
        if mode == "raise":
            raise RetryableError("asked to fail the whole batch")
        if mode == "retry" and ctx.attempt <= int(payload.get("fail_times", 1)):
            outcomes.append(RetryableError(f"asked to fail attempt {ctx.attempt}"))
        elif mode == "fatal":
            outcomes.append(NonRetryableError("asked to fail for good"))
        else:
            outcomes.append(payload)
    short = sum(int(p.get("short_by", 0)) for p, _ in items)
    return outcomes[: max(0, len(outcomes) - short)]
