from __future__ import annotations

import os
import time

from tasks.errors import NonRetryableError, RetryableError
from tasks.registry import Context, handler


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


def _sleep(payload: dict) -> None:
    sleep = payload.get("sleep")
    if isinstance(sleep, (int, float)) and not isinstance(sleep, bool) and sleep > 0:
        time.sleep(min(float(sleep), 3600.0))
