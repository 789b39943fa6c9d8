"""Loads the Lua scripts beside this module, each prefixed with ``_lib.lua``.

redis-py's ``Script`` runs a script by SHA and loads it again on ``NOSCRIPT``
(after a Redis restart or ``SCRIPT FLUSH``), so each is sent whole only once
per server.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

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


def call(name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """Run script ``name`` in one round trip: ``script(name)(keys=keys, args=args)``, leaner.

    For the calls every task makes (start, finish): the command goes straight
    to a pooled connection, without redis-py's per-command layers (a retry
    wrapper that retries nothing here, observability hooks, response callbacks,
    none of which EVALSHA uses); that halves the client's CPU per call. Errors
    are the same: the connection drops itself on a socket error or timeout and
    the error is raised, never re-sent. A Redis that lost the script (restart,
    ``SCRIPT FLUSH``) gets it by ``EVAL``, which loads it again.
    """
    found = script(name)
    pool = found.registered_client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command("EVALSHA", found.sha, len(keys), *keys, *args)
        try:
            return conn.read_response()
        except NoScriptError:
            conn.send_command("EVAL", found.script, len(keys), *keys, *args)
            return conn.read_response()
    finally:
        pool.release(conn)
