"""Request and response shapes of the API (pydantic, through django-ninja).

Types are strict (``"7"`` is not a priority) and unknown fields are refused,
so a malformed request is a 422 whose ``detail`` names the field. Ranges and
lengths are left to admission, which answers with the same closed set of
reasons as ``dispatch.delay`` (``invalid_priority``, ``invalid_chat_id``, ...).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Schema
from pydantic import ConfigDict, Field, StrictFloat, StrictInt, StrictStr, WithJsonSchema

#: Most items in one bulk request.
MAX_BULK_ITEMS = 1000
#: Keys that make a bulk item a wrapper (``{"payload": ..., "chat_id": ...}``) rather than a bare payload.
ITEM_KEYS = frozenset({"payload", "chat_id", "priority", "idempotency_key", "limit_key", "dedupe_key"})

Seconds = Annotated[StrictFloat, Field(description="Whole life from dispatch to completion, in seconds.")]
Priority = Annotated[StrictInt, Field(description="0..9, higher first; the type's default when absent.")]
JsonObject = dict[str, Any]


class DispatchIn(Schema):
    model_config = ConfigDict(extra="forbid")

    task_type: StrictStr = Field(description="A task type's name, one this token may dispatch.")
    payload: JsonObject = Field(description="The handler's input: a JSON object.")
    chat_id: StrictStr | None = Field(None, description="Required for chat-scoped types: order is kept per chat.")
    priority: Priority | None = None
    idempotency_key: StrictStr | None = Field(
        None, description="A second dispatch with this key returns the first task (duplicate: true).")
    dedupe_key: StrictStr | None = Field(
        None, description="For a type whose dedupe is throttle or debounce: the key dispatches collapse by "
                          "(else the idempotency key). Throttle: within the window a later one answers "
                          "duplicate: true with the first's task_id; debounce: it replaces the task still "
                          "waiting (replaced: its id, which ends REVOKED) and starts after the window.")
    timeout: Seconds | None = None
    metadata: JsonObject | None = Field(None, description="Carried to the handler's context (tracing).")
    limit_key: StrictStr | None = Field(
        None, description="The value of the type's per-key limits (e.g. a supplier or tenant); required when "
                          "the type names a limit of scope 'key' (else invalid_limit_key), ignored otherwise.")
    countdown: StrictFloat | None = Field(
        None, description="Send later: seconds from now before the task may start (not with eta; invalid_eta "
                          "past the longest delay or the task's deadline).")
    eta: StrictStr | None = Field(
        None, description="Send later: when the task may start, ISO 8601 with an offset "
                          "(e.g. 2030-01-01T09:00:00+00:00); a naive time is invalid_eta.")
    retry_policy: StrictStr | None = Field(
        None, description="A retry policy's name: failed attempts follow it instead of the type's "
                          "(unknown_retry_policy when none has that name).")


BULK_ITEMS_SCHEMA = {
    "type": "array", "minItems": 1, "maxItems": MAX_BULK_ITEMS,
    "description": ("Each item is a payload object, or {\"payload\": {...}, \"chat_id\"?, \"priority\"?, "
                    "\"idempotency_key\"?, \"limit_key\"?, \"dedupe_key\"?} (an object with a \"payload\" key "
                    "and only those keys). "
                    "Each is admitted or rejected on its own."),
    "items": {"type": "object"},
}


class BulkIn(Schema):
    model_config = ConfigDict(extra="forbid")

    task_type: StrictStr = Field(description="A task type's name, one this token may dispatch.")
    items: Annotated[list[Any], Field(min_length=1, max_length=MAX_BULK_ITEMS), WithJsonSchema(BULK_ITEMS_SCHEMA)]
    priority: Priority | None = None
    timeout: Seconds | None = None
    metadata: JsonObject | None = None
    countdown: StrictFloat | None = Field(None, description="Send every item later: seconds from now.")
    eta: StrictStr | None = Field(None, description="Send every item later: ISO 8601 with an offset.")
    retry_policy: StrictStr | None = Field(None, description="A retry policy's name for every item.")


class DispatchOut(Schema):
    """A ``DispatchResult``: accepted with a task id, or rejected with a reason and detail."""

    accepted: bool
    task_id: str | None
    queue: str | None
    priority: int | None
    position: int | None
    reason: str | None
    detail: str
    duplicate: bool
    estimated_delay: float | None
    replaced: str | None = Field(None, description="The task a debounce replaced (it ends REVOKED: "
                                                   "\"replaced by <this task_id>\"), else null.")


class BulkOut(Schema):
    accepted: int
    rejected: int
    results: list[DispatchOut] = Field(description="One per item, in input order.")


class ErrorOut(Schema):
    """A request refused before admission; ``detail`` is a message, or a list of {loc, msg, type} per field."""

    reason: str
    detail: Any


class DeadLetterOut(Schema):
    reason: str
    status: str
    error: str
    attempts: int
    requeued_task_id: str


class TaskStateOut(Schema):
    task_id: str
    state: str = Field(description="SCHEDULED (sent for later, not due yet), PENDING (waiting for a worker), "
                                   "then Celery's: STARTED, RETRY, SUCCESS, FAILURE, REVOKED")
    task_name: str | None
    result: Any = Field(description="The stored result (a tasks.dispatch message's is its DispatchResult).")
    date_done: datetime | None
    dispatched_task_id: str | None = Field(
        description="For a tasks.dispatch message sent by name: the id of the task it admitted.")
    dead_letter: DeadLetterOut | None
    progress: dict[str, Any] | None = Field(
        None, description="The handler's last ctx.progress: {fraction (0..1), note, at (epoch s)}, or null.")
    history: dict[str, Any] | None = Field(
        None, description="With ?history=1: dispatched, waiting, attempts (worker, started_at, ended_at, outcome, "
                          "error, retry_delay_s), cancelled, dead_letter, result, progress, events.")


class CancelIn(Schema):
    model_config = ConfigDict(extra="forbid")

    reason: StrictStr = Field("", max_length=500, description="Why (kept in the REVOKED result with the token's name).")


class CancelOut(Schema):
    """What the cancel found: ``cancelled``, ``running_told``, ``already_cancelled``, ``already_done``, ..."""

    task_id: str
    outcome: str
    detail: str
