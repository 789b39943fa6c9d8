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

from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError, RedisError, ResponseError

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


class ReplicaAcksMissing(RedisError):
    """Fewer replicas than asked confirmed a script's write in time: a failover may still lose it."""

    def __init__(self, wanted: int, confirmed: int, timeout_ms: int) -> None:
        super().__init__(f"{confirmed} of {wanted} replicas confirmed the write within {timeout_ms} ms")
        self.wanted, self.confirmed, self.timeout_ms = wanted, confirmed, timeout_ms


def call(name: str, keys: Sequence[Any], args: Sequence[Any], directory: Path | None = None, *,
         replicas: int = 0, replicas_timeout_ms: int = 0, wait_if: Callable[[Any], bool] | None = None) -> Any:
    """Run script ``name`` in one round trip: ``script(name)(keys=keys, args=args)``, leaner.

    For the calls every task makes (start, finish): the command goes straight
    to a pooled connection, without redis-py's per-command layers (a retry
    wrapper that retries nothing here, observability hooks, response callbacks,
    none of which EVALSHA uses); that halves the client's CPU per call. Errors
    are the same: the connection drops itself on a socket error or timeout and
    the error is raised, never re-sent. A Redis that lost the script (restart,
    ``SCRIPT FLUSH``, a replica promoted by Sentinel) gets it by ``EVAL``,
    which loads it again.

    ``replicas`` > 0: then ``WAIT replicas replicas_timeout_ms`` on the same
    connection (so it covers this script's writes), when ``wait_if(reply)`` says
    the reply stands for a write the caller will report; fewer confirmations
    raise ``ReplicaAcksMissing``.
    """
    found = script(name, directory)
    pool = found.registered_client.connection_pool  # type: ignore[union-attr]  # never a cluster client here
    conn = pool.get_connection()
    try:
        conn.send_command("EVALSHA", found.sha, len(keys), *keys, *args)
        try:
            reply = conn.read_response()
        except NoScriptError:
            conn.send_command("EVAL", found.script, len(keys), *keys, *args)
            reply = conn.read_response()
        if replicas > 0 and (wait_if is None or wait_if(reply)):
            conn.send_command("WAIT", replicas, replicas_timeout_ms)
            confirmed = int(conn.read_response())
            if confirmed < replicas:
                raise ReplicaAcksMissing(replicas, confirmed, replicas_timeout_ms)
        return reply
    finally:
        pool.release(conn)


def call_many(name: str, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]], directory: Path | None = None, *,
              replicas: int = 0, replicas_timeout_ms: int = 0,
              wait_if: Callable[[Any], bool] | None = None) -> list[Any]:
    """Run script ``name`` once per ``(keys, args)`` of ``calls``, all in one round trip; never raises.

    The calls are pipelined on one connection (no transaction: Redis runs each
    script alone, one after another, in order). Returns one entry per call: its
    reply, or the ``RedisError`` it met: a ``ResponseError`` of that call alone
    (the others stand), or the connection's error for that call and every later
    one, whose outcome is then unknown (sent, perhaps run, unanswered). An
    error while connecting or sending is every call's. ``NOSCRIPT`` answers
    (the script was never run) are sent again by ``EVAL``, in a second round
    trip that happens once per server. ``replicas`` > 0: one ``WAIT`` after
    them all, when some reply passes ``wait_if``; too few confirmations make
    each such reply ``ReplicaAcksMissing``.
    """
    count = len(calls)
    if not count:
        return []
    try:
        found = script(name, directory)
        pool = found.registered_client.connection_pool  # type: ignore[union-attr]  # never a cluster client here
        conn = pool.get_connection()
    except RedisError as exc:
        return [exc] * count
    replies: list[Any] = [None] * count
    try:
        todo = list(range(count))
        for command, body in (("EVALSHA", found.sha), ("EVAL", found.script)):
            try:
                conn.send_packed_command(conn.pack_commands(
                    [(command, body, len(calls[i][0]), *calls[i][0], *calls[i][1]) for i in todo]))
            except RedisError as exc:
                for i in todo:
                    replies[i] = exc
                return replies
            missing = []
            for n, i in enumerate(todo):
                try:
                    replies[i] = conn.read_response()
                except NoScriptError:
                    missing.append(i)
                except ResponseError as exc:
                    replies[i] = exc
                except RedisError as exc:  # the connection broke (redis-py dropped it): the rest are unknown
                    for j in todo[n:]:
                        replies[j] = exc
                    return replies
            if not missing:
                break
            todo = missing
        if replicas > 0:
            waiting = [i for i, reply in enumerate(replies)
                       if not isinstance(reply, RedisError) and (wait_if is None or wait_if(reply))]
            if waiting:
                try:
                    conn.send_command("WAIT", replicas, replicas_timeout_ms)
                    confirmed = int(conn.read_response())
                except RedisError as exc:
                    for i in waiting:
                        replies[i] = exc
                    return replies
                if confirmed < replicas:
                    for i in waiting:
                        replies[i] = ReplicaAcksMissing(replicas, confirmed, replicas_timeout_ms)
        return replies
    finally:
        pool.release(conn)
