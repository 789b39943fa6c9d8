"""``http.post``: deliver the payload as JSON to the task type's ``options.url``."""

from __future__ import annotations

import email.utils
import json
import os
import threading
import time
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3
from django.conf import settings

from lanes.forksafe import ForkSafeLock
from tasks.errors import NonRetryableError, RetryableError
from tasks.registry import handler

RETRYABLE_STATUSES = {408, 425, 429}
_local = threading.local()
_pool_lock = ForkSafeLock()
_pool: tuple[int, urllib3.PoolManager] | None = None


def check_url(url: Any) -> str:
    """Raise ValueError unless ``url`` is http(s) to a host in DISPATCH_WEBHOOK_ALLOWED_HOSTS."""
    if not isinstance(url, str) or not url:
        raise ValueError("options.url is required (an http:// or https:// URL)")
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"options.url {url!r} must be an http:// or https:// URL with a host")
    allowed = [h.lower() for h in settings.DISPATCH_WEBHOOK_ALLOWED_HOSTS]
    if parts.hostname.lower() not in allowed:
        raise ValueError(
            f"options.url host '{parts.hostname}' is not allowed; allowed hosts: {', '.join(allowed)} "
            "(setting DISPATCH_WEBHOOK_ALLOWED_HOSTS)"
        )
    return url


def header_value(text: str) -> str:
    """HTTP header values are ASCII: send other text percent-encoded as UTF-8 (RFC 3986)."""
    return text if text.isascii() else quote(text, safe="")


def validate_options(options: dict) -> None:
    check_url(options.get("url"))
    headers = options.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ValueError("options.headers must be an object of string values")


def _http() -> urllib3.PoolManager:
    """One pooled client per process (a fork gets a fresh one)."""
    global _pool
    pid = os.getpid()
    if _pool is None or _pool[0] != pid:
        with _pool_lock:
            if _pool is None or _pool[0] != pid:
                _pool = (pid, urllib3.PoolManager(num_pools=32, maxsize=64, retries=False))
    return _pool[1]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


@handler("http.post", validate_options=validate_options, option_keys=("url", "headers"))
def post(payload: dict, ctx: Any) -> dict:
    """POST the payload as JSON to options.url; 2xx succeeds, 408/425/429/5xx retry, other 4xx give up."""
    try:
        url = check_url(ctx.options.get("url"))
    except ValueError as exc:
        raise NonRetryableError(str(exc)) from None
    headers = {
        **ctx.options.get("headers", {}),
        "Content-Type": "application/json",
        "Idempotency-Key": header_value(ctx.idempotency_key),
        "X-Dispatch-Task-Id": ctx.task_id,
        "X-Dispatch-Type": ctx.type,
        "X-Dispatch-Chat-Id": header_value(ctx.chat_id),
        "X-Dispatch-Attempt": str(ctx.attempt),
    }
    timeout = max(0.05, ctx.remaining)
    try:
        response = _http().request(
            "POST", url, body=json.dumps(payload).encode(), headers=headers,
            timeout=urllib3.Timeout(total=timeout), redirect=False, preload_content=True,
        )
    except urllib3.exceptions.HTTPError as exc:
        raise RetryableError(f"POST {url} failed: {type(exc).__name__}: {exc}") from None
    status = response.status
    if 200 <= status < 300:
        return {"status": status}
    detail = f"POST {url} answered {status}: {response.data[:200]!r}"
    if status in RETRYABLE_STATUSES or status >= 500:
        raise RetryableError(detail, retry_after_s=parse_retry_after(response.headers.get("Retry-After")))
    raise NonRetryableError(detail)
