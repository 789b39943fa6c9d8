"""Seed 004's SMS send worker as a demo: ``sms.submit`` (batched) and its unbatched twin ``sms.submit_one``.

Each message is a task (payload ``{"to": "+86...", "channel": "ch1", "text": ...}``,
its idempotency key its identity). Submitting a batch takes, whatever its size:

1. one query for the database's facts (``WHERE key IN (...)``): a message
   already submitted (a re-send after a partial failure) is answered from its
   row and not sent again;
2. one request per channel to the supplier (``tools.sms_supplier``), which
   accepts, throttles (per-channel TPS: the item retries after a short delay)
   or rejects (a dead letter) each message;
3. one short transaction writing one row per accepted message (one ``INSERT``;
   a row already there is kept).

If anything fails after the supplier accepted (the insert, the worker), the
items retry and are sent again with the same keys: the supplier answers the
same submit id and submits nothing twice, and the row is written then. The
twin does the same steps for one message: three round trips per message
instead of three per batch.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.db import transaction

from tasks.errors import NonRetryableError, RetryableError
from tasks.registry import BatchItem, Context, handler
from tools.models import SmsMessage

if TYPE_CHECKING:
    import urllib3

#: Seconds a throttled message waits before it is sent again.
THROTTLED_RETRY_S = 0.2
_pool: urllib3.PoolManager | None = None


def _http() -> urllib3.PoolManager:
    global _pool
    if _pool is None:
        import urllib3  # on the first request: every process that declares the demo's types imports this module

        _pool = urllib3.PoolManager(maxsize=32)
    return _pool


def validate_options(options: dict) -> None:
    """The supplier is simulated: its URL must be on loopback."""
    url = options.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError("options.url must be the simulated supplier's http://127.0.0.1:PORT/submit")


@handler("sms.submit", batch=True, validate_options=validate_options, option_keys=("url",))
def submit(items: list[BatchItem]) -> list[Any]:
    """Submit a batch of SMS: one query, one supplier request per channel, one insert (seed 004, P2)."""
    return submit_many(items)


@handler("sms.submit_one", validate_options=validate_options, option_keys=("url",))
def submit_one(payload: dict, ctx: Context) -> dict:
    """The unbatched twin of sms.submit: the same three steps for one message."""
    outcome = submit_many([BatchItem(payload, ctx)])[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def submit_many(items: list[BatchItem]) -> list[Any]:
    """One outcome per item: ``{"submit_id": ...}`` or the item's error."""
    import urllib3

    outcomes: list[Any] = [None] * len(items)
    keys = [ctx.idempotency_key for _, ctx in items]
    known = dict(SmsMessage.objects.filter(key__in=keys).values_list("key", "submit_id"))
    by_channel: dict[str, list[int]] = defaultdict(list)
    for i, (payload, ctx) in enumerate(items):
        if ctx.idempotency_key in known:
            outcomes[i] = {"submit_id": known[ctx.idempotency_key]}
        elif not isinstance(payload.get("to"), str) or not isinstance(payload.get("channel"), str):
            outcomes[i] = NonRetryableError("payload needs 'to' and 'channel' strings")
        else:
            by_channel[payload["channel"]].append(i)
    rows = []
    for channel, indexes in by_channel.items():
        first_ctx = items[indexes[0]].ctx
        body = {"channel": channel, "messages": [
            {"key": items[i].ctx.idempotency_key, "to": items[i].payload["to"],
             "text": items[i].payload.get("text", "")} for i in indexes]}
        try:
            response = _http().request(
                "POST", first_ctx.options["url"], body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
                timeout=urllib3.Timeout(total=max(0.05, min(items[i].ctx.remaining for i in indexes))), retries=False)
            if response.status != 200:
                raise RetryableError(f"supplier answered {response.status} for channel {channel!r}")
            results = json.loads(response.data)["results"]
            if len(results) != len(indexes):
                raise RetryableError(f"supplier answered {len(results)} results for {len(indexes)} messages")
        except (urllib3.exceptions.HTTPError, ValueError, KeyError, RetryableError) as exc:
            error = exc if isinstance(exc, RetryableError) else RetryableError(f"supplier unreachable: {exc!r}")
            for i in indexes:
                outcomes[i] = error
            continue
        for i, result in zip(indexes, results, strict=True):
            payload, ctx = items[i]
            if result.get("status") == "accepted":
                rows.append(SmsMessage(key=ctx.idempotency_key, task_id=ctx.task_id, channel=channel,
                                       to=payload["to"], submit_id=result["submit_id"], attempt=ctx.attempt))
                outcomes[i] = {"submit_id": result["submit_id"]}
            elif result.get("status") == "throttled":
                outcomes[i] = RetryableError(f"channel {channel!r} throttled", retry_after_s=THROTTLED_RETRY_S)
            else:
                outcomes[i] = NonRetryableError(f"supplier rejected the message: {result.get('error')}")
    if rows:
        # One short transaction for the batch: an accepted message without its row
        # would be sent again (same key, same submit id) by the retry this raise causes.
        with transaction.atomic():
            SmsMessage.objects.bulk_create(rows, ignore_conflicts=True)
    return outcomes
