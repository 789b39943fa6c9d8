"""Opt-in instrumentation for load tests and benchmarks: Redis round trips and SQL statements, per process.

Not part of the hot path unless asked for: a worker loads it with
``celery -A dispatchsite worker ... -I tools.probe`` and ``DISPATCH_PROBE_DIR``
set to a directory. Every process then counts

- Redis round trips: each request written to a Redis socket (a pipeline or a
  Lua call is one), by patching redis-py's ``send_packed_command`` (kombu's
  broker traffic goes through it too);
- SQL statements by kind (select, insert, update, ...), with Django's
  ``execute_wrapper`` on each new connection;
- SQL transactions a connection ended itself (``sql_commit``, ``sql_rollback``:
  an ``atomic`` block's, ``bulk_create``'s), which execute wrappers never see. On
  PostgreSQL each is two round trips more than its statements (psycopg sends
  the ``BEGIN`` before the first statement, then the ``COMMIT``); a statement in
  autocommit is its own transaction and is not counted here;

and writes them to ``<dir>/probe-<pid>.json`` about once a second (a file, so
the probe adds no Redis commands of its own). ``read_dir`` sums the files.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from lanes.forksafe import ForkSafeLock

_lock = ForkSafeLock()
_counts: Counter = Counter()
_installed = False
_flusher_pid: int | None = None
FLUSH_INTERVAL_S = 0.5


def count(name: str, n: int = 1) -> None:
    with _lock:
        _counts[name] += n
    _ensure_flusher()


def snapshot() -> dict[str, int]:
    with _lock:
        return dict(_counts)


def install(sql: bool = True) -> None:
    """Patch redis-py and (with ``sql``) hook Django's connections (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    from redis.connection import AbstractConnection

    original = AbstractConnection.send_packed_command

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> Any:
        count("redis_round_trips")
        return original(self, command, check_health)

    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
    _hook_celery_ready()
    if not sql:
        return
    try:
        from django.conf import settings

        settings.DATABASES  # noqa: B018 - raises when Django is not configured (e.g. a Dramatiq worker)
    except Exception:  # noqa: BLE001
        return
    from django.db.backends.signals import connection_created

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        if _sql_counter not in connection.execute_wrappers:
            connection.execute_wrappers.append(_sql_counter)

    connection_created.connect(on_connection, weak=False)
    _count_transactions()
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        on_connection(None, conn)


def _hook_celery_ready() -> None:
    """Write ``ready-<pid>`` into the probe directory when a Celery worker starts consuming."""
    directory = os.environ.get("DISPATCH_PROBE_DIR")
    if not directory:
        return
    try:
        from celery.signals import worker_ready
    except ImportError:
        return

    def on_ready(**kwargs: Any) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"ready-{os.getpid()}").write_text("ready")

    worker_ready.connect(on_ready, weak=False)


def _count_transactions() -> None:
    """Count each transaction a connection commits or rolls back (Django's ``_commit``/``_rollback``)."""
    from django.db.backends.base.base import BaseDatabaseWrapper

    for name in ("commit", "rollback"):
        original = getattr(BaseDatabaseWrapper, f"_{name}")

        def counted(self: Any, _original: Any = original, _name: str = name) -> Any:
            if self.connection is not None:
                count(f"sql_{_name}")
            return _original(self)

        setattr(BaseDatabaseWrapper, f"_{name}", counted)


def _sql_counter(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    word = (sql.lstrip().split(None, 1) or ["?"])[0].lower()
    count(f"sql_{word}")
    count("sql_statements")
    return execute(sql, params, many, context)


def _reset_after_fork() -> None:
    """A forked child starts from zero: what the parent counted is in the parent's file."""
    _counts.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


def _ensure_flusher() -> None:
    # Runs on every count: decided once per process (the directory comes from
    # the environment the process was started with).
    global _flusher_pid
    if _flusher_pid == os.getpid():
        return
    with _lock:
        if _flusher_pid == os.getpid():
            return
        _flusher_pid = os.getpid()
    directory = os.environ.get("DISPATCH_PROBE_DIR")
    if not directory:
        return
    threading.Thread(target=_flush_forever, args=(Path(directory),), name="probe-flush", daemon=True).start()


def _flush_forever(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    while _flusher_pid == pid:
        write(directory)
        time.sleep(FLUSH_INTERVAL_S)


def write(directory: Path) -> None:
    target = directory / f"probe-{os.getpid()}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(snapshot()))
    os.replace(tmp, target)


def read_dir(directory: Path | str) -> dict[str, int]:
    """Sum the counters of every process that wrote into ``directory``."""
    total: Counter = Counter()
    for path in Path(directory).glob("probe-*.json"):
        try:
            total.update(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return dict(total)


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    names = set(after) | set(before)
    return {k: after.get(k, 0) - before.get(k, 0) for k in names if after.get(k, 0) != before.get(k, 0)}


if os.environ.get("DISPATCH_PROBE_DIR"):
    install(sql="django" in sys.modules)
