"""``admit_many.lua``'s wrapper: a chunk of one task type's dispatches admitted in one script call.

Each item is admitted exactly as ``admit.lua`` admits one (both run
``admit_one``, ``_admit.lua``); what one call saves is admit.lua's per-item
``EVALSHA``, config ``GET`` and the lane's shared writes (docs/redis-budget.md).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from lanes import keys
from lanes.lua import admit
from lanes.lua.loader import Packed, ScriptStream, bulk_strings
from lanes.lua.loader import utf8_length as _length

NAME = "admit_many"


def stream() -> ScriptStream:
    """A ``ScriptStream`` of admit_many.lua calls (``keys_and_args`` of each): a chunk a call, many a round trip."""
    return ScriptStream(NAME)


def keys_and_args(items: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[Any]]:
    """admit_many.lua's KEYS and ARGV for ``items``: each ``admit.keys_and_args``'s keyword arguments.

    The reference ``packed`` is held equal to (``tests/integration/test_admit_many_packing.py``):
    ``dispatch_many`` sends ``packed``, which writes the same call as text.

    Every item is of one task type (one lane, one config version); the chunk's
    ``now`` is its first item's. An item's keys are its record's, then those of
    its idempotency key and its chat if it has them (one key for a plain item:
    a tenth of a bulk dispatch's CPU an item was packing arguments). The reply
    is ``{'stale', version}`` or shortened admit.lua replies; ``replies`` reads it.
    """
    first = items[0]
    shared_keys, shared_args = admit.keys_and_args(**first)
    task_type = first["task_type"]
    item_keys: list[Any] = []
    item_args: list[Any] = []
    task_record, idempotency, legacy, chat_queue = (keys.task_record, keys.idempotency, keys.legacy_idempotency,
                                                    keys.chat_queue)
    for item in items:
        task_id, chat, key = item["task_id"], item["chat"], item["idempotency_key"]
        item_keys.append(task_record(task_id, chat or None))
        digest = item["payload_digest"] if key else ""
        if digest:
            item_keys += (idempotency(task_type, key), legacy(task_type, key))
        if chat:
            item_keys.append(chat_queue(chat))
        limits = item.get("limits")
        item_args += (task_id, item["message"], item["kombu_priority"], chat, digest,
                      int(item["deadline"] * 1000), "\n".join(limits) if limits else "",
                      int(item.get("due", 0.0) * 1000))
    return shared_keys + item_keys, shared_args + item_args


def packed(items: Sequence[Mapping[str, Any]]) -> Packed:
    """``keys_and_args(items)`` already in Redis' protocol, for ``ScriptStream.send``.

    Written as text an item at a time: hiredis packed each of an item's nine
    arguments on its own, a tenth of a bulk dispatch's CPU an item (the test
    holds the two equal, byte for byte).
    """
    first = items[0]
    shared_keys, shared_args = admit.keys_and_args(**first)
    task_type = first["task_type"]
    key_text: list[str] = []
    arg_text: list[str] = []
    count = 0
    task_record, idempotency, legacy, chat_queue = (keys.task_record, keys.idempotency, keys.legacy_idempotency,
                                                    keys.chat_queue)
    for item in items:
        task_id, chat, key, message = item["task_id"], item["chat"], item["idempotency_key"], item["message"]
        record = task_record(task_id, chat or None)
        key_text.append(f"${_length(record)}\r\n{record}\r\n")
        digest = item["payload_digest"] if key else ""
        if digest:
            key_text.append(bulk_strings((idempotency(task_type, key), legacy(task_type, key))))
            count += 2
        if chat:
            key_text.append(bulk_strings((chat_queue(chat),)))
            count += 1
        limits = item.get("limits")
        limit_text = "\n".join(limits) if limits else ""
        deadline, due = _ms(item["deadline"]), _ms(item.get("due", 0.0))
        priority = _DIGITS[item["kombu_priority"]]
        arg_text.append(
            f"${_length(task_id)}\r\n{task_id}\r\n${_length(message)}\r\n{message}\r\n"
            f"${len(priority)}\r\n{priority}\r\n${_length(chat)}\r\n{chat}\r\n${len(digest)}\r\n{digest}\r\n"
            f"${len(deadline)}\r\n{deadline}\r\n${_length(limit_text)}\r\n{limit_text}\r\n"
            f"${len(due)}\r\n{due}\r\n")
    numkeys = len(shared_keys) + len(items) + count
    text = bulk_strings(shared_keys) + "".join(key_text) + bulk_strings(shared_args) + "".join(arg_text)
    return Packed(numkeys, numkeys + len(shared_args) + 8 * len(items), text.encode())


#: A kombu priority's text (0..9).
_DIGITS = tuple(str(digit) for digit in range(10))


@functools.lru_cache(maxsize=256)
def _ms(seconds: float) -> str:
    """``seconds`` in whole milliseconds, as text (as ``keys_and_args`` writes them): a chunk's items share
    their deadline and due times (one ``now`` a chunk), so this is mostly a lookup."""
    return str(int(seconds * 1000))


def replies(reply: Any, count: int) -> list[Any]:
    """One admit.lua reply per item of a call of ``count`` items (a 'stale' reply stands for every item).

    An 'ok' reply gets back what admit_many.lua sent once for all (the lane's
    estimate inputs, at admit.lua's indexes), and what it left out as implied:
    a depth alone is a task no limit holds, at position depth + 1 with depth
    tasks ahead. Each is then as admit.lua would have answered it.
    """
    if isinstance(reply, list) and reply and reply[0] == b"stale":
        return [reply] * count
    if not isinstance(reply, list) or len(reply) != count + 1:
        raise ValueError(f"admit_many.lua answered {len(reply) - 1 if isinstance(reply, list) else reply!r} "
                         f"replies for {count} items")
    inputs, out = reply[0], reply[1:]
    estimate = None
    for index, item in enumerate(out):
        if isinstance(item, int) or item[0] == b"ok":
            if estimate is None:
                if len(inputs) != 6:  # never expected: the first 'ok' item reads them
                    raise ValueError(f"admit_many.lua answered 'ok' without the estimate inputs ({inputs!r})")
                # As numbers once (interpret reads each again with int() and float(): cheap on a number).
                estimate = (int(inputs[0]), int(inputs[1]), float(inputs[2]), float(inputs[3]), int(inputs[4]),
                            int(inputs[5]))
            done, prev, busy, prev_busy, paused, consumers = estimate
            if isinstance(item, int):
                out[index] = [b"ok", item + 1, item, done, prev, item, busy, prev_busy, paused, consumers, b"", 0, 0]
            else:
                out[index] = [b"ok", item[1], item[2], done, prev, item[3], busy, prev_busy, paused, consumers,
                              *(item[4:] or _NO_LIMIT)]
    return out


#: An 'ok' reply's limit fields for a task no limit holds (admit.lua's: no instance, none ahead, no pause).
_NO_LIMIT = (b"", 0, 0)
