"""The result backend: django-celery-results, writing each result row with one upsert.

The stock backend does ``get_or_create`` (SELECT, then INSERT) per task; the
benchmark profile showed that upsert as the largest part of a worker child's
time. ``INSERT ... ON CONFLICT (task_id) DO UPDATE`` (SQLite and PostgreSQL)
makes it one statement, and a redelivered task re-storing its outcome still
lands on the same row.

The statement is built once per database vendor and run through the
connection's cursor with plain parameters: the ORM's ``bulk_create`` cost more
than the write itself (a model instance, field ``pre_save`` hooks and an SQL
compilation per task, inside an ``atomic`` block that added a ``BEGIN``). In
autocommit mode the one statement is its own transaction; inside a caller's
``atomic`` block it joins that transaction, as the ORM call did.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any

from celery import states
from django.db import connections, router
from django.utils import timezone
from django_celery_results.backends.database import DatabaseBackend
from django_celery_results.models import TaskResult

#: Columns an update may overwrite (``date_created`` keeps the first write,
#: ``date_started`` is only written by the STARTED state).
UPDATE_FIELDS = ("status", "result", "traceback", "meta", "content_encoding", "content_type",
                 "periodic_task_name", "task_name", "task_args", "task_kwargs", "worker", "date_done")
#: Columns of one row, in the order :func:`upsert_rows` expects its tuples.
ROW_FIELDS = ("task_id", *UPDATE_FIELDS, "date_created")

_statements: dict[tuple[str, str, int], str] = {}


def _statement(connection: Any, n_rows: int) -> str:
    """``INSERT ... VALUES (...) x n_rows ON CONFLICT (task_id) DO UPDATE``, built once per vendor and size."""
    key = (connection.vendor, connection.alias, n_rows)
    sql = _statements.get(key)
    if sql is None:
        q = connection.ops.quote_name
        meta = TaskResult._meta
        columns = [q(meta.get_field(name).column) for name in ROW_FIELDS]
        row = "(" + ", ".join(["%s"] * len(columns)) + ")"
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns[1:1 + len(UPDATE_FIELDS)])
        sql = (f"INSERT INTO {q(meta.db_table)} ({', '.join(columns)}) VALUES {', '.join([row] * n_rows)} "
               f"ON CONFLICT ({q(meta.get_field('task_id').column)}) DO UPDATE SET {updates}")
        _statements[key] = sql
    return sql


def upsert_rows(using: str | None, rows: Iterable[dict[str, Any]]) -> int:
    """Insert or overwrite result rows (dicts keyed by :data:`ROW_FIELDS` less the dates) in one statement.

    Both dates are set to now; on conflict ``date_created`` keeps its first
    value. A task id given twice keeps its last row (PostgreSQL refuses to
    update one row twice in a statement). Returns the number of rows written.
    """
    by_id: dict[str, dict[str, Any]] = {}
    for row in rows:
        by_id[row["task_id"]] = row
    if not by_id:
        return 0
    connection = connections[using or router.db_for_write(TaskResult)]
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    params: list[Any] = []
    for row in by_id.values():
        params.extend(row.get(name) for name in ROW_FIELDS[:-2])
        params.append(now)  # date_done
        params.append(now)  # date_created
    with connection.cursor() as cursor:
        cursor.execute(_statement(connection, len(by_id)), params)
    return len(by_id)


def upsert_row(using: str | None, row: dict[str, Any]) -> None:
    upsert_rows(using, (row,))


# -- group commit ---------------------------------------------------------------
#: Most rows in one statement (SQLite allows 32,766 parameters, PostgreSQL 65,535).
MAX_BATCH_ROWS = 256


class _Slot:
    __slots__ = ("done", "error", "row", "using")

    def __init__(self, using: str | None, row: dict[str, Any]) -> None:
        self.using = using
        self.row = row
        self.done = threading.Event()
        self.error: BaseException | None = None


_lock = threading.Lock()
_queue: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
_writer: threading.Thread | None = None
_writer_pid: int | None = None


def store_row(using: str | None, row: dict[str, Any]) -> None:
    """Write ``row`` and return once it is committed; rows of concurrent threads share one statement.

    A task running in a process's main thread (a prefork child: one task at a
    time) writes its row itself. Task threads of a thread pool hand their rows
    to one writer thread per process, which gathers what arrives within
    ``DISPATCH_RESULT_GROUP_WINDOW_MS`` of the first row and writes them in
    one multi-row upsert (one transaction, on one connection, instead of 16
    threads taking turns at SQLite's writer lock). Each caller returns only
    after its own row is committed, and raises if it was not: the result is
    stored before the task is acknowledged, as with one statement per task.
    """
    connection = connections[using or router.db_for_write(TaskResult)]
    if (connection.in_atomic_block or threading.current_thread() is threading.main_thread()
            or _window_s() < 0):
        # Inside the caller's transaction the row must be part of it; a main
        # thread runs one task at a time and has nobody to share with; a
        # negative window turns group commit off.
        upsert_row(using, row)
        return
    slot = _Slot(using, row)
    _ensure_writer()
    _queue.put(slot)
    slot.done.wait()
    if slot.error is not None:
        raise slot.error


def _ensure_writer() -> None:
    global _writer, _writer_pid
    if _writer is not None and _writer_pid == os.getpid() and _writer.is_alive():
        return
    with _lock:
        if _writer is not None and _writer_pid == os.getpid() and _writer.is_alive():
            return
        _writer_pid = os.getpid()
        _writer = threading.Thread(target=_write_forever, name="dispatch-results", daemon=True)
        _writer.start()


def _window_s() -> float:
    from django.conf import settings

    return settings.DISPATCH_RESULT_GROUP_WINDOW_MS / 1000


def _write_forever() -> None:
    window_s = _window_s()
    while True:
        batch = [_queue.get()]
        until = time.monotonic() + window_s
        while len(batch) < MAX_BATCH_ROWS:
            try:
                batch.append(_queue.get(timeout=max(0.0, until - time.monotonic())) if window_s
                             else _queue.get_nowait())
            except queue.Empty:
                break
        try:
            write_batch(batch)
        except BaseException as exc:  # noqa: BLE001 - the writer must outlive any error; callers get it
            for slot in batch:
                slot.error = slot.error or exc
        finally:
            for slot in batch:
                slot.done.set()


def write_batch(batch: list[_Slot]) -> None:
    """Write every slot's row, recording per slot the error that kept it from being stored.

    A failed multi-row statement is retried row by row, so one bad row fails
    only its own task, and a broken connection is replaced for the retry.
    """
    by_using: dict[str | None, list[_Slot]] = {}
    for slot in batch:
        by_using.setdefault(slot.using, []).append(slot)
    for using, slots in by_using.items():
        try:
            upsert_rows(using, [s.row for s in slots])
        except Exception as exc:  # noqa: BLE001 - each error goes to its own caller
            connection = connections[using or router.db_for_write(TaskResult)]
            connection.close_if_unusable_or_obsolete()
            if len(slots) == 1:
                slots[0].error = exc
                continue
            for s in slots:
                try:
                    upsert_row(using, s.row)
                except Exception as row_exc:  # noqa: BLE001 - raised in the caller's thread
                    s.error = row_exc


def _after_fork_in_child() -> None:
    # The parent's writer thread does not exist in the child, and its lock may
    # have been held at the fork: start clean.
    global _lock, _queue, _writer, _writer_pid
    _lock = threading.Lock()
    _queue = queue.SimpleQueue()
    _writer = None
    _writer_pid = None


os.register_at_fork(after_in_child=_after_fork_in_child)


class UpsertBackend(DatabaseBackend):
    def result_row(self, task_id: str, result: Any, status: str, traceback: Any = None,
                   request: Any = None) -> tuple[dict[str, Any], Any]:
        """The row to store (keyed by column) and the encoded result Celery returns."""
        content_type, content_encoding, encoded = self.encode_content(result)
        meta = {**self._get_meta_from_request(request), "children": self.current_task_children(request)}
        _, _, encoded_meta = self.encode_content(meta)
        row = self._get_extended_properties(request, traceback)
        row.update(task_id=task_id, content_encoding=content_encoding, content_type=content_type,
                   meta=encoded_meta, result=encoded, status=status, traceback=traceback)
        return row, encoded

    def _store_result(self, task_id: str, result: Any, status: str, traceback: Any = None,
                      request: Any = None, using: str | None = None) -> Any:
        if status == states.STARTED:
            return super()._store_result(task_id, result, status, traceback, request, using)
        row, encoded = self.result_row(task_id, result, status, traceback, request)
        store_row(using, row)
        return encoded
