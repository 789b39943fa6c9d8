"""The admin's task search (by task id, chat id or idempotency key): what Redis and the result rows say.

Read-only; the page's cancel buttons go through ``tasks.cancel``. Every value
shown comes from Redis or the database and is escaped by the template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_celery_results.models import TaskResult

from lanes import keys, records
from lanes.redis_client import get_redis
from tasks.cancel import valid_task_id
from tasks.validation import MAX_CHAT_ID_LEN, MAX_IDEMPOTENCY_KEY_LEN, is_clean_text

KINDS = ("task", "chat", "key")
#: Most messages of one chat listed.
CHAT_ROWS = 200
#: States in which a cancel still removes the task (it waits) or tells it (it runs).
CANCELLABLE = {"queued", "retry", "scheduled", "limited", "running"}


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    state: str  # the record's state, or the outcome its tombstone / result row keeps
    lane: str = ""
    type: str = ""
    chat: str = ""
    attempt: int = 0
    where: str = ""  # 'redis', 'just finished' (its tombstone), 'result row'

    @property
    def cancellable(self) -> bool:
        return self.state in CANCELLABLE


def _text(value: bytes | None) -> str:
    return value.decode(errors="replace") if value else ""


def task(task_id: str) -> TaskRow | None:
    """One task by id, wherever it is still known.

    A chat-scoped task's record is searched for among the live ones (``lanes.records.locate``:
    O(live tasks), as a cancel by id alone); a finished one's tombstone does not keep its chat.
    """
    if not valid_task_id(task_id):
        return None
    client = get_redis()
    record = records.locate(client, task_id)
    if record:
        st, lane, ttype, att, chat = client.hmget(record, "st", "lane", "type", "att", "chat")
        if st:
            return TaskRow(task_id, _text(st), _text(lane), _text(ttype), _text(chat), int(att or 0), "redis")
    tomb = client.get(keys.tombstone(task_id))
    if tomb:
        return TaskRow(task_id, _text(tomb).partition("|")[0], where="just finished")
    row: Any = TaskResult.objects.filter(task_id=task_id).values("status", "task_name").first()
    if row:
        return TaskRow(task_id, row["status"], type=row["task_name"] or "", where="result row")
    return None


def chat(chat_id: str) -> list[TaskRow]:
    """Everything queued for a chat, head first."""
    if not is_clean_text(chat_id, MAX_CHAT_ID_LEN):
        return []
    client = get_redis()
    ids = [_text(x) for x in client.lrange(keys.chat_queue(chat_id), 0, CHAT_ROWS - 1)]
    pipe = client.pipeline(transaction=False)
    for task_id in ids:
        pipe.hmget(keys.task_record(task_id, chat_id), "st", "lane", "type", "att")
    return [TaskRow(t, _text(st), _text(lane), _text(ttype), chat_id, int(att or 0), "redis")
            for t, (st, lane, ttype, att) in zip(ids, pipe.execute(), strict=True)]


def by_key(task_type: str, idempotency_key: str) -> TaskRow | None:
    """The task an idempotency key of ``task_type`` names (within the type's idempotency window)."""
    if not is_clean_text(task_type, 100) or not is_clean_text(idempotency_key, MAX_IDEMPOTENCY_KEY_LEN):
        return None
    found = get_redis().hget(keys.idempotency(task_type, idempotency_key), "task")
    return task(_text(found)) if found else None
