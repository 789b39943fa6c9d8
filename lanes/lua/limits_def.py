"""``limits_def.lua``'s wrapper: publish the limits' definitions for the gate."""

from __future__ import annotations

import json

from lanes import keys
from lanes.lua.loader import call

NAME = "limits_def"


def publish_definitions(limits: dict[str, dict], *, now: float) -> int:
    """Write ``limits`` (name -> definition) as the gate reads them; returns how many changed.

    ``None`` values are left out (the scripts read a missing field as "not set");
    the JSON is canonical (sorted keys), so an unchanged limit is not rewritten.
    """
    pairs: list[str] = []
    for name, definition in sorted(limits.items()):
        clean = {k: v for k, v in definition.items() if v is not None and v is not False and v != {}}
        pairs += [name, json.dumps(clean, sort_keys=True, separators=(",", ":"))]
    return int(call(NAME, [keys.LIMIT_DEFS, keys.LIMIT_DUE], [int(now * 1000), keys.LIMIT_PREFIX, *pairs]))
