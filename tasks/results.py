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

import json
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from celery import current_app, states
from celery.exceptions import TaskRevokedError
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult
from django.db import connections, router
from django.utils import timezone
from django_celery_results.backends.database import DatabaseBackend
from django_celery_results.models import TaskResult
from kombu.serialization import registry as serializer_registry
from kombu.utils import json as kombu_json

from lanes import jsontext, keys, leases
from lanes.redis_client import get_redis
from tasks import history
from tasks.errors import DeadLettered

#: Columns an update may overwrite (``date_created`` keeps the first write,
#: ``date_started`` is only written by the STARTED state).
UPDATE_FIELDS = ("status", "result", "traceback", "meta", "content_encoding", "content_type",
                 "periodic_task_name", "task_name", "task_args", "task_kwargs", "worker", "date_done")
#: Columns of one row, in the order :func:`upsert_rows` expects its tuples.
ROW_FIELDS = ("task_id", *UPDATE_FIELDS, "date_created")

_statements: dict[tuple[str, int, bool], str] = {}


def _statement(connection: Any, n_rows: int, keep_ready: bool = False) -> str:
    """``INSERT ... VALUES (...) x n_rows ON CONFLICT (task_id) DO UPDATE``, built once per database and size.

    ``keep_ready``: the update leaves a row already in a final state alone (a
    late RETRY must not replace the REVOKED row a cancel wrote meanwhile).
    """
    key = (connection.alias, n_rows, keep_ready)
    sql = _statements.get(key)
    if sql is None:
        q = connection.ops.quote_name
        meta = TaskResult._meta
        columns = [q(meta.get_field(name).column) for name in ROW_FIELDS]
        row = "(" + ", ".join(["%s"] * len(columns)) + ")"
        updates = ", ".join(_update(f"{q(meta.db_table)}.{c}", f"EXCLUDED.{c}", name == "meta")
                            for name, c in zip(UPDATE_FIELDS, columns[1:1 + len(UPDATE_FIELDS)], strict=True))
        sql = (f"INSERT INTO {q(meta.db_table)} ({', '.join(columns)}) VALUES {', '.join([row] * n_rows)} "
               f"ON CONFLICT ({q(meta.get_field('task_id').column)}) DO UPDATE SET {updates}")
        if keep_ready:
            final = ", ".join(f"'{state}'" for state in sorted(states.READY_STATES))
            sql += f" WHERE {q(meta.db_table)}.{q(meta.get_field('status').column)} NOT IN ({final})"
        _statements[key] = sql
    return sql


#: ``meta`` holding a task's history events (``tasks.history.ROW_META_KEY``), as a LIKE pattern ('%%': the
#: cursor's escape of '%').
_HISTORY_IN_META = '%%"' + history.ROW_META_KEY + '"%%'


def _update(stored: str, new: str, is_meta: bool) -> str:
    """One column's ``SET`` of the upsert. ``meta`` keeps the stored row's when that one carries the task's
    history events and the new one does not: a finished task's row stored again (its copy redelivered after
    the row was written) comes from a process that holds none of its events (tasks.history.take_for_row)."""
    column = stored.rsplit(".", 1)[1]
    if not is_meta:
        return f"{column} = {new}"
    return (f"{column} = CASE WHEN {stored} LIKE '{_HISTORY_IN_META}' AND ({new} IS NULL OR {new} NOT LIKE "
            f"'{_HISTORY_IN_META}') THEN {stored} ELSE {new} END")


def upsert_rows(using: str | None, rows: Iterable[dict[str, Any]], keep_ready: bool = False) -> int:
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
        cursor.execute(_statement(connection, len(by_id), keep_ready), params)
    return len(by_id)


def upsert_row(using: str | None, row: dict[str, Any], keep_ready: bool = False) -> None:
    upsert_rows(using, (row,), keep_ready)


#: The states a type with ``store_result = 'failures'`` keeps a row for.
FAILURE_STATES = frozenset({states.FAILURE, states.REVOKED})


def keeps_row(type_name: str | None, state: str) -> bool:
    """Whether an outcome of ``type_name`` in ``state`` gets a result row (its ``TaskType.store_result``)."""
    if not type_name:
        return True
    from tasks import config  # inner import: config imports the models, which this module's importers need first

    try:
        tc = config.current().types.get(type_name)
    except Exception:  # noqa: BLE001 - the config unreadable: keep the row, as every type did before
        return True
    mode = tc.store_result if tc is not None else "always"
    return mode == "always" or (mode == "failures" and state in FAILURE_STATES)


class RowTerms(NamedTuple):
    """What a group's rows are written by that comes from Celery's configuration (``result_extended``, and
    whether rows may carry history events: ``tasks.history.rows_outlive_history``): read once by a worker's
    group runner rather than once a group, each read of ``app.conf`` costing 6-22 µs (85 µs a group, 3 % of
    the worker's main process under a no-op backlog, py-spy). None for a term: read at the call."""

    extended: bool | None = None
    events_in_rows: bool | None = None

    @classmethod
    def of(cls, backend: Any) -> RowTerms:
        """The terms in force now (the configuration a worker started with)."""
        return cls(backend.rows_extended(), history.rows_outlive_history())


#: Every term read at the call.
READ_AT_CALL = RowTerms()


class Outcome(NamedTuple):
    """One task's outcome to store as its row: ``request`` carries the row's task fields and, once the
    outcome is in Redis, ``dispatch_settle`` (the finished record, and the state whose row settles it)."""

    task_id: str
    type_name: str
    request: Any
    value: Any
    state: str


def store_rows(backend: UpsertBackend, outcomes: Sequence[Outcome], book: leases.LeaseBook,
               terms: RowTerms | None = None) -> bool:
    """The rows of many outcomes in one statement (a group's, a batch's), then their finished records settled
    by ``book``, the lease book of the process that holds them.

    A type that keeps no row for an outcome (``store_result``) is settled at once. ``terms``: the configuration
    the rows are written by (``RowTerms.of``), read here when not given. Returns False when the
    statement failed: those records stay, and their leases bring the rows back (``start.lua`` answers
    'finished' to the copy the sweep sends).
    """
    terms = terms or READ_AT_CALL
    kept = []
    keeps: dict[tuple[str, str], bool] = {}  # a group is mostly of one type and state: one config look each
    for outcome in outcomes:
        key = (outcome.type_name, outcome.state)
        keep = keeps.get(key)
        if keep is None:
            keep = keeps[key] = keeps_row(outcome.type_name, outcome.state)
        if keep:
            kept.append(outcome)
        else:
            _settle(outcome, book)
    if not kept:
        return True
    events = history.take_for_rows([(o.task_id, o.state) for o in kept], terms.events_in_rows)
    try:
        rows = backend.result_rows([(o.task_id, backend.encode_result(o.value, o.state), o.state, o.request, text)
                                    for o, text in zip(kept, events, strict=True)], terms.extended)
        # A state that is not final (RETRY) never replaces a final one (a cancel's REVOKED).
        upsert_rows(None, rows, keep_ready=all(o.state not in states.READY_STATES for o in kept))
    except Exception:
        logging.getLogger(__name__).exception("rows_not_stored items=%d", len(kept))
        for outcome, text in zip(kept, events, strict=True):
            outcome.request.dispatch_settle = None
            history.give_back(outcome.task_id, text)
        return False
    for outcome in kept:
        _settle(outcome, book)
    return True


def _settle(outcome: Outcome, book: leases.LeaseBook) -> None:
    settle = getattr(outcome.request, "dispatch_settle", None)
    if settle and settle[1] == outcome.state:
        book.settle(settle[0])


def outcome_from_redis(task_id: str, timeout: float | None, propagate: bool, interval: float,
                       failures_have_rows: bool) -> Any:
    """``DispatchResult.get`` for a type that keeps no row for its successes: the outcome Redis keeps
    (the task's tombstone, ``finish.lua``: for a few minutes after it ended). A failure of a type that
    keeps failures' rows is read from its row, as ``AsyncResult.get`` reads it."""
    until = None if timeout is None else time.monotonic() + timeout
    while True:
        tomb = get_redis().get(keys.tombstone(task_id))
        if tomb is not None:
            raw = tomb.decode("utf-8", errors="replace") if isinstance(tomb, bytes) else str(tomb)
            outcome, _, text = raw.partition("|")
            if outcome == "done":
                return json.loads(text)
            if failures_have_rows:
                left = None if until is None else max(0.1, until - time.monotonic())
                return AsyncResult(task_id, app=current_app._get_current_object()).get(
                    timeout=left, propagate=propagate, interval=interval)
            try:
                detail = json.loads(text)
            except ValueError:
                detail = text
            error: Exception = (TaskRevokedError(detail) if outcome == "cancelled"
                                else DeadLettered(str(detail), outcome))
            if propagate:
                raise error
            return error
        # No tombstone: a type that now keeps no row may have kept one when this task ended (its
        # store_result changed meanwhile; a success with a row writes no tombstone): the row answers.
        result = AsyncResult(task_id, app=current_app._get_current_object())
        if result.ready():
            return result.get(timeout=1.0, propagate=propagate, interval=interval)
        if until is not None and time.monotonic() >= until:
            raise CeleryTimeoutError(f"task {task_id} did not end within {timeout}s")
        time.sleep(interval)


class UpsertBackend(DatabaseBackend):
    def _encode(self, data: Any) -> tuple[str, str, Any]:
        """Celery's encoding of a value (content type, encoding, text): with the serializer registered as kombu
        registers its ``json``, the text of ``jsontext.kombu_text`` (the same, with an encoder built once)."""
        codec = serializer_registry._encoders.get(self.serializer)
        if codec is not None and codec.encoder is kombu_json.dumps:
            text = jsontext.kombu_text(data)
            if text is not None:
                return codec.content_type, codec.content_encoding, text
        return super()._encode(data)

    def result_row(self, task_id: str, result: Any, status: str, traceback: Any = None,
                   request: Any = None, events: str = "") -> tuple[dict[str, Any], Any]:
        """The row to store (keyed by column) and the encoded result Celery returns; ``events``: the task's
        history events it carries (``tasks.history.take_for_row``), in its ``meta``."""
        content_type, content_encoding, encoded = self.encode_content(result)
        meta = {**self._get_meta_from_request(request), "children": self.current_task_children(request)}
        if events:
            meta[history.ROW_META_KEY] = events
        _, _, encoded_meta = self.encode_content(meta)
        row = self._get_extended_properties(request, traceback)
        if getattr(request, "shadow", None):  # the task type (lanes.messages), not its handler
            row["task_name"] = request.shadow
        row.update(task_id=task_id, content_encoding=content_encoding, content_type=content_type,
                   meta=encoded_meta, result=encoded, status=status, traceback=traceback)
        return row, encoded

    def rows_extended(self) -> bool:
        """Celery's ``result_extended``: whether rows carry the task's name, arguments and worker."""
        return bool(self.app.conf.find_value_for_key("extended", "result"))

    def result_rows(self, outcomes: Sequence[tuple[str, Any, str, Any, str]],
                    extended: bool | None = None) -> list[dict[str, Any]]:
        """The rows of many outcomes (task id, encoded result, state, request, history events; no traceback):
        each what ``result_row`` makes, with what every row of a group shares looked up or encoded once (the
        ``result_extended`` setting, the empty meta, the ``argsrepr`` the platform's messages carry)."""
        if extended is None:
            extended = self.rows_extended()
        encoded: dict[str, Any] = {}  # argsrepr -> its encoding ("()" for every platform message)
        empty_meta = None
        rows = []
        for task_id, result, status, request, events in outcomes:
            content_type, content_encoding, content = self.encode_content(result)
            meta = getattr(request, "meta", None) or {}
            children = getattr(request, "children", None)
            if not meta and not children and not events:
                if empty_meta is None:
                    empty_meta = self.encode_content({"children": []})[2]
                encoded_meta = empty_meta
            else:
                full = {**meta, "children": self.current_task_children(request)}
                if events:
                    full[history.ROW_META_KEY] = events
                encoded_meta = self.encode_content(full)[2]
            row: dict[str, Any] = {"periodic_task_name": None, "task_args": None, "task_kwargs": None,
                                   "task_name": None, "traceback": None, "worker": None}
            if request and extended:  # as DatabaseBackend._get_extended_properties
                args = getattr(request, "argsrepr", None)
                if args is None:
                    args = getattr(request, "args", None)
                if isinstance(args, str):
                    if args not in encoded:
                        encoded[args] = self.encode_content(args)[2]
                    args = encoded[args]
                elif args is not None:
                    args = self.encode_content(args)[2]
                kwargs = getattr(request, "kwargsrepr", None)
                if kwargs is None:
                    kwargs = getattr(request, "kwargs", None)
                if kwargs is not None:
                    kwargs = self.encode_content(kwargs)[2]
                row.update(periodic_task_name=getattr(request, "periodic_task_name", None), task_args=args,
                           task_kwargs=kwargs, task_name=getattr(request, "task", None),
                           worker=getattr(request, "hostname", None))
            if getattr(request, "shadow", None):  # the task type (lanes.messages), not its handler
                row["task_name"] = request.shadow
            row.update(task_id=task_id, content_encoding=content_encoding, content_type=content_type,
                       meta=encoded_meta, result=content, status=status, traceback=None)
            rows.append(row)
        return rows

    def _store_result(self, task_id: str, result: Any, status: str, traceback: Any = None,
                      request: Any = None, using: str | None = None) -> Any:
        if status == states.STARTED:
            return super()._store_result(task_id, result, status, traceback, request, using)
        if not keeps_row(getattr(request, "shadow", None), status):
            return self.encode_content(result)[2]  # its type keeps no row for this outcome (TaskType.store_result)
        events = history.take_for_row(task_id, status)
        try:
            row, encoded = self.result_row(task_id, result, status, traceback, request, events=events)
            # A state that is not final (RETRY) never replaces a final one (a cancel's REVOKED).
            upsert_row(using, row, keep_ready=status not in states.READY_STATES)
        except BaseException:
            history.give_back(task_id, events)
            raise
        return encoded


# --- cancelled tasks (tasks.cancel) --------------------------------------------


def store_revoked(task_id: str, detail: str, request: Any = None) -> None:
    """Record a cancel as Celery's ``REVOKED`` state, ``detail`` (reason and who asked) as its reason.

    ``AsyncResult.get()`` then raises ``celery.exceptions.TaskRevokedError`` and
    Flower's result view shows the state. Idempotent (the row is upserted).
    """
    from celery import current_app

    current_app.backend.mark_as_revoked(task_id, detail, request=request)


def stored_state(task_id: str) -> str | None:
    """The state of ``task_id``'s result row, or None without one (a cancel answering what it found)."""
    return TaskResult.objects.filter(task_id=task_id).values_list("status", flat=True).first()


def announce_revoked(task_id: str) -> None:
    """Send Celery's ``task-revoked`` event (Flower's live view), when workers send task events; never raise."""
    from celery import current_app

    app = current_app._get_current_object()
    if not app.conf.worker_send_task_events:
        return
    try:
        with app.events.default_dispatcher() as dispatcher:
            dispatcher.send("task-revoked", uuid=task_id, terminated=False, signum=None, expired=False)
    except Exception:  # the cancel holds without the event
        import logging

        logging.getLogger(__name__).warning("revoked_event_not_sent task=%s", task_id, exc_info=True)
