"""The result backend: django-celery-results, writing each result row with one upsert.

The stock backend does ``get_or_create`` (SELECT, then INSERT) per task; the
benchmark profile showed that upsert as the largest part of a worker child's
time. ``INSERT ... ON CONFLICT (task_id) DO UPDATE`` (SQLite and PostgreSQL)
makes it one statement, and a redelivered task re-storing its outcome still
lands on the same row.
"""

from __future__ import annotations

from typing import Any

from celery import states
from django_celery_results.backends.database import DatabaseBackend
from django_celery_results.models import TaskResult

#: Columns an update may overwrite (``date_created`` keeps the first write).
UPDATE_FIELDS = ("status", "result", "traceback", "meta", "content_encoding", "content_type",
                 "periodic_task_name", "task_name", "task_args", "task_kwargs", "worker", "date_done")


class UpsertBackend(DatabaseBackend):
    def _store_result(self, task_id: str, result: Any, status: str, traceback: Any = None,
                      request: Any = None, using: str | None = None) -> Any:
        if status == states.STARTED:
            return super()._store_result(task_id, result, status, traceback, request, using)
        content_type, content_encoding, encoded = self.encode_content(result)
        meta = {**self._get_meta_from_request(request), "children": self.current_task_children(request)}
        _, _, encoded_meta = self.encode_content(meta)
        fields = {
            "content_encoding": content_encoding, "content_type": content_type, "meta": encoded_meta,
            "result": encoded, "status": status, "traceback": traceback,
        }
        fields.update(self._get_extended_properties(request, traceback))
        row = TaskResult(task_id=task_id, **{k: v for k, v in fields.items() if k in UPDATE_FIELDS})
        TaskResult.objects.using(using).bulk_create(
            [row], update_conflicts=True, unique_fields=["task_id"], update_fields=list(UPDATE_FIELDS),
        )
        return encoded
