"""admit.lua's call built argument by argument: the reference ``lanes.lua.admit.packed`` is held to.

``tests/integration/test_admit_many_packing.py`` packs this with hiredis and
compares the bytes with ``packed``'s, which writes the same call as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lanes import keys
from lanes.lua.admit import Chunk, Item, shared_args, shared_keys


def keys_and_args(chunk: Chunk, items: Sequence[Item], *,
                  read_estimate: bool = True) -> tuple[list[Any], list[Any]]:
    """admit.lua's KEYS and ARGV for ``items``, in its header's order."""
    item_keys: list[Any] = []
    item_args: list[Any] = []
    for item in items:
        item_keys.append(keys.task_record(item.task_id, item.chat or None))
        digest = item.payload_digest if item.idempotency_key else ""
        if digest:
            item_keys += (keys.idempotency(chunk.task_type, item.idempotency_key),
                          keys.legacy_idempotency(chunk.task_type, item.idempotency_key))
        if item.chat:
            item_keys.append(keys.chat_queue(item.chat))
        if item.dedupe_key:
            item_keys.append(keys.dedupe(chunk.task_type, item.dedupe_key))
        item_args += (item.task_id, item.message, item.kombu_priority, item.chat, digest,
                      int(item.deadline * 1000), "\n".join(item.limits), int(item.due * 1000),
                      "1" if item.dedupe_key else "")
    return shared_keys(chunk) + item_keys, shared_args(chunk, read_estimate) + item_args
