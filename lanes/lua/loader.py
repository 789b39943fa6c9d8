"""Loads the Lua scripts (each ``<name>.lua`` prefixed with ``_lib.lua``) and runs them.

The scripts live beside this module, each with one typed Python wrapper
(``lanes/lua/admit.py`` for ``admit.lua``, ...): the wrapper is the only code
that knows the order of a script's KEYS and ARGV; callers pass named values.
A script kept elsewhere (the load-test sink's) is loaded from its own
``directory``, with the same ``_lib.lua`` prefix if it has one there.

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

SCRIPT_DIR = Path(__file__).parent


@cache
def _source(name: str, directory: Path | None = None) -> str:
    folder = directory or SCRIPT_DIR
    lib = folder / "_lib.lua"
    prefix = lib.read_text() + "\n" if lib.exists() else ""
    return prefix + (folder / f"{name}.lua").read_text()


_scripts: dict[tuple[int, str, Path | None], Script] = {}


def script(name: str, directory: Path | None = None) -> Script:
    client = get_redis()
    key = (id(client), name, directory)
    found = _scripts.get(key)
    if found is None:
        found = _scripts[key] = client.register_script(_source(name, directory))
    return found


def call(name: str, keys: Sequence[Any], args: Sequence[Any], directory: Path | None = None) -> Any:
    """Run script ``name`` in one round trip: ``script(name)(keys=keys, args=args)``, leaner.

    For the calls every task makes (start, finish): the command goes straight
    to a pooled connection, without redis-py's per-command layers (a retry
    wrapper that retries nothing here, observability hooks, response callbacks,
    none of which EVALSHA uses); that halves the client's CPU per call. Errors
    are the same: the connection drops itself on a socket error or timeout and
    the error is raised, never re-sent. A Redis that lost the script (restart,
    ``SCRIPT FLUSH``) gets it by ``EVAL``, which loads it again.
    """
    found = script(name, directory)
    pool = found.registered_client.connection_pool  # type: ignore[union-attr]  # never a cluster client here
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
