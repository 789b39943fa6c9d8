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
same submit id and submits nothing twice, and the row is written then.

The twin is written as a plain handler for one message would be, and takes the
same steps: its row's ``SELECT``, one request, one ``INSERT``. Each statement is
its own transaction (autocommit), so a message costs two database round trips;
run through ``submit_many`` as a batch of one it cost four (``bulk_create``'s
atomic block added a ``BEGIN`` and a ``COMMIT`` around the one ``INSERT``) for
the same one commit.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction

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
    """The unbatched twin of sms.submit, a plain handler: its row's facts, one request, one row (two statements)."""
    key = ctx.idempotency_key
    known = SmsMessage.objects.filter(key=key).values_list("submit_id", flat=True).first()
    if known is not None:
        return {"submit_id": known}  # submitted before (a re-send after a partial failure)
    to, channel = payload.get("to"), payload.get("channel")
    if not isinstance(to, str) or not isinstance(channel, str):
        raise NonRetryableError("payload needs 'to' and 'channel' strings")
    (result,) = _post(ctx.options["url"], channel, [{"key": key, "to": to, "text": payload.get("text", "")}],
                      ctx.remaining)
    status = result.get("status")
    if status == "throttled":
        raise RetryableError(f"channel {channel!r} throttled", retry_after_s=THROTTLED_RETRY_S)
    if status != "accepted":
        raise NonRetryableError(f"supplier rejected the message: {result.get('error')}")
    try:
        # save(), not bulk_create: no atomic block around the one INSERT (autocommit makes it one transaction).
        SmsMessage(key=key, task_id=ctx.task_id, channel=channel, to=to, submit_id=result["submit_id"],
                   attempt=ctx.attempt).save(force_insert=True)
    except IntegrityError:
        pass  # the row is there: an earlier attempt wrote it (the supplier answered the same submit id)
    return {"submit_id": result["submit_id"]}


def _post(url: str, channel: str, messages: list[dict], remaining_s: float) -> list[dict]:
    """One supplier request for ``messages`` of ``channel``: one result each, in order; RetryableError otherwise."""
    import urllib3

    try:
        response = _http().request(
            "POST", url, body=json.dumps({"channel": channel, "messages": messages}).encode(),
            headers={"Content-Type": "application/json"},
            timeout=urllib3.Timeout(total=max(0.05, remaining_s)), retries=False)
        if response.status != 200:
            raise RetryableError(f"supplier answered {response.status} for channel {channel!r}")
        results = json.loads(response.data)["results"]
    except (urllib3.exceptions.HTTPError, ValueError, KeyError) as exc:
        raise RetryableError(f"supplier unreachable: {exc!r}") from exc
    if not isinstance(results, list) or len(results) != len(messages):
        got = len(results) if isinstance(results, list) else "no list of"
        raise RetryableError(f"supplier answered {got} results for {len(messages)} messages")
    return results


def submit_many(items: list[BatchItem]) -> list[Any]:
    """One outcome per item: ``{"submit_id": ...}`` or the item's error."""
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
        messages = [{"key": items[i].ctx.idempotency_key, "to": items[i].payload["to"],
                     "text": items[i].payload.get("text", "")} for i in indexes]
        try:
            results = _post(items[indexes[0]].ctx.options["url"], channel, messages,
                            min(items[i].ctx.remaining for i in indexes))
        except RetryableError as error:
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
