"""Loads the Lua scripts beside this module, each prefixed with ``_lib.lua``.

redis-py's ``Script`` runs a script by SHA and loads it again on ``NOSCRIPT``
(after a Redis restart or ``SCRIPT FLUSH``), so each is sent whole only once
per server.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from redis.commands.core import Script

from lanes.redis_client import get_redis

SCRIPT_DIR = Path(__file__).with_name("scripts")


@cache
def _source(name: str) -> str:
    lib = (SCRIPT_DIR / "_lib.lua").read_text()
    return lib + "\n" + (SCRIPT_DIR / f"{name}.lua").read_text()


_scripts: dict[tuple[int, str], Script] = {}


def script(name: str) -> Script:
    client = get_redis()
    key = (id(client), name)
    found = _scripts.get(key)
    if found is None:
        found = _scripts[key] = client.register_script(_source(name))
    return found
