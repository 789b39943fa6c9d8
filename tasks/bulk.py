"""``dispatch_many``: many dispatches of one task type, one Redis round trip per chunk of items.

Each item is admitted or rejected on its own, exactly as ``dispatch.delay``
would (the same validation, the same admit.lua, the same reasons), and the
results come back in input order. What changes is the cost: a chunk of
``CHUNK_ITEMS`` items is validated in the caller and its admit.lua calls are
pipelined on one connection, so a chunk pays one round trip instead of one per
item. The contract is the same: accepted means stored; an item whose answer
was lost with the connection is ``unavailable`` with "outcome unknown", and a
retry with the same idempotency keys returns the stored tasks and never makes a
second.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

import redis
from celery import shared_task

from lanes.lua.admit import admit_many as lua_admit_many
from tasks import config
from tasks.admission import (
    DISPATCH_OPTIONS,
    DispatchResult,
    Prepared,
    config_kept_changing,
    confirm_config,
    interpret,
    prepare,
    rejected_invalid,
    unavailable,
)
from tasks.validation import Invalid, shown

logger = logging.getLogger(__name__)

#: Items admitted in one Redis round trip: large enough that the round trip is
#: noise, small enough that one chunk's scripts keep Redis busy for only a few ms.
CHUNK_ITEMS = 500
#: Rounds a chunk makes when admit.lua answers 'stale' (an admin save landed mid-chunk).
MAX_ROUNDS = 4


def dispatch_many(task_type: str, items: Iterable[Any], *, timeout: float | None = None,
                  metadata: dict | None = None) -> list[DispatchResult]:
    """Dispatch each of ``items`` as a task of ``task_type``; one ``DispatchResult`` per item, in order.

    An item is a payload (a JSON object), or a pair ``(payload, options)``
    whose options are ``dispatch.delay``'s keyword arguments (``chat_id``,
    ``priority``, ``idempotency_key``, ``timeout``, ``metadata``, ``limit_key``,
    ...). ``timeout`` and ``metadata`` here are every item's default; an item's
    own options win. Never raises for bad input: a bad item is a rejection with
    its reason, and the other items are admitted regardless.
    """
    entries = list(items)
    results: list[DispatchResult | None] = [None] * len(entries)
    defaults = {"timeout": timeout, "metadata": metadata}
    try:
        snap = config.current()
    except redis.RedisError as exc:
        return [unavailable(exc, None) for _ in entries]
    for start in range(0, len(entries), CHUNK_ITEMS):
        snap = _admit_chunk(snap, task_type, entries, start, min(start + CHUNK_ITEMS, len(entries)), defaults,
                            results)
    return results  # type: ignore[return-value]  # every slot is filled by _admit_chunk


def split_item(item: Any, defaults: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``(payload, options)`` of one item, the call's defaults under its own; ``Invalid`` if its shape is wrong.

    A pair is a tuple or list of two (a JSON list is never a payload, so
    ``[payload, options]`` read from JSON means the same); anything else is
    the payload itself, which validation then judges.
    """
    if not isinstance(item, (tuple, list)):
        return item, dict(defaults)
    if len(item) != 2:
        raise Invalid("invalid_payload", f"an item is a payload or a (payload, options) pair, not a sequence of "
                                         f"{len(item)}")
    payload, options = item
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise Invalid("invalid_payload", f"an item's options must be a dict of dispatch options, not "
                                         f"{type(options).__name__}")
    unknown = sorted(shown(name, 40) for name in options if not isinstance(name, str) or name not in DISPATCH_OPTIONS)
    if unknown:
        raise Invalid("invalid_payload", f"unknown dispatch options: {', '.join(unknown)} "
                                         f"(known: {', '.join(sorted(DISPATCH_OPTIONS))})")
    merged = dict(defaults)
    merged.update(options)
    return payload, merged


def _admit_chunk(snap: config.Snapshot, task_type: Any, entries: list[Any], start: int, stop: int,
                 defaults: dict[str, Any], results: list[DispatchResult | None]) -> config.Snapshot:
    """Admit ``entries[start:stop]`` into ``results``; returns the config snapshot it ended with."""
    pending: list[tuple[int, Any, dict[str, Any], str]] = []
    for index in range(start, stop):
        try:
            payload, options = split_item(entries[index], defaults)
        except Invalid as exc:
            results[index] = rejected_invalid(snap, task_type, exc)
            continue
        pending.append((index, payload, options, str(uuid.uuid4())))
    confirmed = False
    for _ in range(MAX_ROUNDS):
        if not pending:
            return snap
        prepared: list[tuple[int, Prepared]] = []
        invalid: list[tuple[int, Invalid]] = []
        for index, payload, options, task_id in pending:
            try:
                prepared.append((index, prepare(snap, task_type, payload, task_id=task_id, **options)))
            except Invalid as exc:
                invalid.append((index, exc))
        if invalid and not confirmed:
            # As in admit: a rejection may come from a cached config older than a fresh admin save.
            confirmed = True
            fresh = confirm_config(snap)
            if fresh.version != snap.version:
                snap = fresh
                continue
        for index, exc in invalid:
            results[index] = rejected_invalid(snap, task_type, exc)
        if not prepared:
            return snap
        replies = lua_admit_many([p.script_args for _, p in prepared])
        stale_version = ""
        stale: set[int] = set()
        for (index, item), reply in zip(prepared, replies, strict=True):
            if isinstance(reply, redis.RedisError):
                results[index] = unavailable(reply, item.task_id)
                continue
            status = reply[0].decode()
            if status == "stale":
                stale.add(index)
                stale_version = reply[1].decode()
                continue
            results[index] = interpret(reply, status, item, snap.limits)
        lost = [reply for reply in replies if isinstance(reply, redis.RedisError)]
        if lost:
            logger.warning("dispatch_many_unavailable type=%s items=%d error=%s", shown(task_type, 100), len(lost),
                           lost[-1])
        if not stale:
            return snap
        try:
            snap = config.ensure(stale_version)
        except redis.RedisError as exc:  # nothing of these was written: admit.lua stopped at the version
            for index in stale:
                results[index] = unavailable(exc, None)
            return snap
        pending = [entry for entry in pending if entry[0] in stale]
    for index, *_ in pending:
        results[index] = config_kept_changing()
    return snap


@shared_task(name="tasks.dispatch_many", typing=False)
def dispatch_many_by_name(task_type: Any = None, items: Any = None, **options: Any) -> list[dict[str, Any]]:
    """Run by an ``ingress`` worker for callers that send ``tasks.dispatch_many`` by name: one dict per item."""
    if not isinstance(items, list):
        detail = f"items must be a list of payloads or [payload, options] pairs, not {type(items).__name__}"
        return [DispatchResult(False, reason="invalid_payload", detail=detail).as_dict()]
    unknown = sorted(set(options) - {"timeout", "metadata"})
    if unknown:
        detail = f"unknown dispatch_many options: {unknown} (known: metadata, timeout)"
        return [DispatchResult(False, reason="invalid_payload", detail=detail).as_dict() for _ in items]
    return [result.as_dict() for result in dispatch_many(task_type, items, **options)]
