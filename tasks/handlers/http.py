"""``http.post``: deliver the payload as JSON to the task type's ``options.url``."""

from __future__ import annotations

import email.utils
import json
import os
import threading
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from django.conf import settings

from lanes.forksafe import ForkSafeLock
from tasks.errors import NonRetryableError, RetryableError, TaskCancelled
from tasks.registry import BatchItem, Context, handler
from tasks.webhook_url import WebhookTarget, WebhookURLError, parse_webhook_url, pin_addresses, redact_url

if TYPE_CHECKING:
    import urllib3

RETRYABLE_STATUSES = {408, 425, 429}
#: Most bytes of a response body read (the rest is not read; the result says so).
MAX_RESPONSE_BYTES = 64 * 1024
_local = threading.local()
_pool_lock = ForkSafeLock()
_pool: tuple[int, urllib3.PoolManager] | None = None


def check_url(url: Any) -> WebhookTarget:
    """The checked target of ``url``, resolved once; WebhookURLError (a ValueError) says why not."""
    target = parse_webhook_url(url, settings.DISPATCH_WEBHOOK_ALLOWED_HOSTS)
    pin_addresses(target, settings.DISPATCH_WEBHOOK_ALLOWED_HOSTS)
    return target


#: Headers the handler sets itself (a second ``Host`` would let the receiver pick either).
RESERVED_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


def header_value(text: str) -> str:
    """HTTP header values are ASCII: send other text percent-encoded as UTF-8 (RFC 3986)."""
    return text if text.isascii() else quote(text, safe="")


def validate_options(options: dict) -> None:
    """The same URL check as at execution (syntax, allow-list, resolved address), and the headers."""
    check_url(options.get("url"))
    headers = options.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ValueError("options.headers must be an object of string values")
    reserved = sorted(k for k in headers if k.lower() in RESERVED_HEADERS)
    if reserved:
        raise ValueError(f"options.headers may not set {', '.join(reserved)} (the handler sets it)")


def _http() -> urllib3.PoolManager:
    """One pooled client per process (a fork gets a fresh one)."""
    global _pool
    # inner import: urllib3 (with ssl and http.client) is 0.05 s of every process's start (this module is imported
    # in every process, to declare the handler); only a send uses it
    import urllib3

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
def post(payload: dict, ctx: Context) -> dict:
    """POST the payload as JSON to options.url; 2xx succeeds, 408/425/429/5xx retry, other 4xx give up."""
    import urllib3  # inner import: imported by the first send, not by every process's start (see _http)

    allow_list = settings.DISPATCH_WEBHOOK_ALLOWED_HOSTS
    try:
        target = parse_webhook_url(ctx.options.get("url"), allow_list)
        addresses = pin_addresses(target, allow_list)
    except WebhookURLError as exc:
        raise NonRetryableError(str(exc)) from None
    shown = redact_url(target.url)
    headers = {
        **{k: v for k, v in ctx.options.get("headers", {}).items() if k.lower() not in RESERVED_HEADERS},
        "Host": target.host_header,
        "Content-Type": "application/json",
        "Idempotency-Key": header_value(ctx.idempotency_key),
        "X-Dispatch-Task-Id": ctx.task_id,
        "X-Dispatch-Type": ctx.type,
        "X-Dispatch-Chat-Id": header_value(ctx.chat_id),
        "X-Dispatch-Attempt": str(ctx.attempt),
    }
    timeout = max(0.05, ctx.remaining)
    if ctx.cancelled:  # the last moment the send can still be avoided (one HEXISTS)
        raise TaskCancelled(f"cancelled before POST {shown}")
    # Connect to the address just checked (no second resolution: no DNS rebinding);
    # TLS still verifies the certificate against the URL's host name.
    tls = {"server_hostname": target.host, "assert_hostname": target.host} if target.scheme == "https" else None
    response = None
    for n, address in enumerate(addresses):
        try:
            pool = _http().connection_from_host(address, target.port, target.scheme, pool_kwargs=tls)
            response = pool.urlopen(
                "POST", target.request_uri, body=json.dumps(payload).encode(), headers=headers,
                timeout=urllib3.Timeout(total=timeout), redirect=False, retries=False, preload_content=False,
            )
            break
        except urllib3.exceptions.NewConnectionError:
            if n + 1 < len(addresses):
                continue  # refused before anything was sent: the next checked address
            raise RetryableError(f"POST {shown} failed: cannot connect to {', '.join(addresses)}") from None
        except urllib3.exceptions.HTTPError as exc:
            raise RetryableError(f"POST {shown} failed: {type(exc).__name__}: {redact_text(str(exc), target)}") \
                from None
    assert response is not None
    try:
        body, truncated = read_bounded(response, MAX_RESPONSE_BYTES)
    except urllib3.exceptions.HTTPError as exc:
        raise RetryableError(f"POST {shown} failed reading the answer: {type(exc).__name__}") from None
    status = response.status
    if 200 <= status < 300:
        return {"status": status, "body_truncated": True, "body_bytes_read": len(body)} if truncated else \
            {"status": status}
    detail = f"POST {shown} answered {status}: {body[:200]!r}{' (body truncated)' if truncated else ''}"
    if status in RETRYABLE_STATUSES or status >= 500:
        raise RetryableError(detail, retry_after_s=parse_retry_after(response.headers.get("Retry-After")))
    raise NonRetryableError(detail)


def read_bounded(response: urllib3.BaseHTTPResponse, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the body, and whether there was more (that connection is closed, not drained)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = response.read(min(limit + 1 - size, 16 * 1024))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    if size > limit:
        response.close()  # do not read the rest; the connection is not reused
        return data[:limit], True
    response.release_conn()
    return data, False


def redact_text(text: str, target: WebhookTarget) -> str:
    """An exception's text may quote the request: keep the query string out of it."""
    query = target.request_uri.partition("?")[2]
    return text.replace(query, "***") if query else text


@handler("http.post_batch", batch=True, validate_options=validate_options, option_keys=("url", "headers"))
def post_batch(items: list[BatchItem]) -> list[Any]:
    """Batched http.post: POST each item as http.post does; one outcome per item (its answer or its error).

    Each request carries ``X-Dispatch-Batch`` (``<batch id>/<items>``), so a receiver
    can tell which items one handler call sent.
    """
    batch = f"{uuid.uuid4().hex[:12]}/{len(items)}"
    outcomes: list[Any] = []
    for payload, ctx in items:
        options = {**ctx.options, "headers": {**ctx.options.get("headers", {}), "X-Dispatch-Batch": batch}}
        try:
            outcomes.append(post(payload, replace(ctx, options=options)))
        except Exception as exc:  # noqa: BLE001 - this item's outcome; the others go on
            outcomes.append(exc)
    return outcomes
