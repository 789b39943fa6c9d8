"""``admit_many.lua``'s wrapper: a chunk of one task type's dispatches admitted in one script call.

Each item is admitted exactly as ``admit.lua`` admits one (both run
``admit_one``, ``_admit.lua``); what one call saves is admit.lua's per-item
``EVALSHA``, config ``GET`` and the lane's shared writes (docs/redis-budget.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lanes import keys
from lanes.lua import admit
from lanes.lua.loader import ScriptStream

NAME = "admit_many"


def stream() -> ScriptStream:
    """A ``ScriptStream`` of admit_many.lua calls (``keys_and_args`` of each): a chunk a call, many a round trip."""
    return ScriptStream(NAME)


def keys_and_args(items: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[Any]]:
    """admit_many.lua's KEYS and ARGV for ``items``: each ``admit.keys_and_args``'s keyword arguments.

    Every item is of one task type (one lane, one config version); the chunk's
    ``now`` is its first item's. The reply is ``{'stale', version}`` or one
    admit.lua reply per item, in order; ``replies`` reads it.
    """
    first = items[0]
    shared_keys, shared_args = admit.keys_and_args(**first)
    task_type = first["task_type"]
    item_keys: list[Any] = []
    item_args: list[Any] = []
    for item in items:
        task_id, chat, key = item["task_id"], item["chat"], item["idempotency_key"]
        record = keys.task_record(task_id, chat or None)
        item_keys += (record, keys.idempotency(task_type, key) if key else record,
                      keys.chat_queue(chat) if chat else record,
                      keys.legacy_idempotency(task_type, key) if key else record)
        item_args += (task_id, item["message"], item["kombu_priority"], chat, item["payload_digest"],
                      int(item["deadline"] * 1000), "\n".join(item.get("limits", ())), int(item.get("due", 0.0) * 1000))
    return shared_keys + item_keys, shared_args + item_args


def replies(reply: Any, count: int) -> list[Any]:
    """One admit.lua reply per item of a call of ``count`` items (a 'stale' reply stands for every item)."""
    if isinstance(reply, list) and reply and reply[0] == b"stale":
        return [reply] * count
    if not isinstance(reply, list) or len(reply) != count:
        raise ValueError(f"admit_many.lua answered {len(reply) if isinstance(reply, list) else reply!r} "
                         f"replies for {count} items")
    return reply
