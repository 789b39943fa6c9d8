"""``/api/v1/``: dispatch one task, dispatch many, read a task's state.

The same contract as ``tasks.dispatch.admit``: every answer is a
``DispatchResult`` (as JSON), a rejection carries a reason from the documented
closed set, and the HTTP status follows ``api.statuses``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from typing import Any

import redis
from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django_celery_results.models import TaskResult
from ninja import NinjaAPI
from ninja.errors import HttpError, ValidationError
from ninja.openapi.docs import ABS_TPL_PATH, Swagger
from ninja.openapi.views import openapi_view

from api import ratelimit, statuses, tenancy
from api.auth import Caller, ServiceTokenAuth
from api.errors import ApiError, body
from api.models import DispatchAudit
from api.schemas import (
    ITEM_KEYS,
    BulkIn,
    BulkOut,
    CancelIn,
    CancelOut,
    DispatchIn,
    DispatchOut,
    ErrorOut,
    TaskStateOut,
)
from lanes import records
from lanes.redis_client import get_redis
from tasks import cancel as cancelling
from tasks import config, tracing
from tasks import history_view as task_history
from tasks.admission import rejected_invalid, unavailable
from tasks.dispatch import DispatchResult, admit, dispatch_many
from tasks.models import DeadLetter
from tasks.validation import Invalid, shown

logger = logging.getLogger(__name__)

#: Admitted task ids kept in one audit row.
AUDIT_MAX_TASK_IDS = 100
MAX_TASK_ID_LEN = 64


def _docs_for_staff(view: Any) -> Any:
    """The interactive docs page is for staff; the schema itself (openapi.json) is public."""
    if getattr(view, "func", None) is openapi_view:
        return staff_member_required(view)
    return view


class SiteSwagger(Swagger):
    """Swagger UI from this site's static files (the CSP allows no CDN and no inline script).

    django-ninja renders its static-files page only when "ninja" is an installed app, and otherwise
    renders ``template_cdn`` by path through Django's engine: here, that same static-files page (its
    templates and static files are named by path in the settings, ``NINJA_DIR``).
    """

    template_cdn = str(ABS_TPL_PATH / "swagger.html")


api = NinjaAPI(
    title="Dispatch API",
    version="1",
    description=("Dispatch tasks to the platform from any language. Every request carries the header "
                 "`Authorization: Bearer <service token>` (a token from the admin or `manage.py api_token`)."),
    urls_namespace="api-v1",
    auth=ServiceTokenAuth(),
    docs=SiteSwagger(),
    docs_url="/docs" if settings.DISPATCH_API_DOCS else None,
    docs_decorator=_docs_for_staff,
)

REFUSALS = {401: ErrorOut, 403: ErrorOut, 413: ErrorOut, 422: ErrorOut, 429: ErrorOut}


def _json(request: HttpRequest, status: int, data: Any, headers: dict[str, str] | None = None) -> JsonResponse:
    response = JsonResponse(data, status=status, safe=False, json_dumps_params={"ensure_ascii": False})
    for name, value in (headers or {}).items():
        response[name] = value
    return response


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> JsonResponse:
    return _json(request, exc.status, body(exc.reason, exc.detail), exc.headers)


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> JsonResponse:
    detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors]
    return _json(request, 422, body("invalid_request", detail))


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> JsonResponse:
    reason = "invalid_request" if exc.status_code == 400 else "error"
    detail = "request body is not valid JSON" if "parse request body" in str(exc) else str(exc)
    return _json(request, exc.status_code, body(reason, detail))


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> JsonResponse:
    return _json(request, 413, body("body_too_large", str(exc)))


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> JsonResponse:
    return _json(request, 404, body("not_found", str(exc) or "not found"))


@api.exception_handler(Exception)
def _internal(request: HttpRequest, exc: Exception) -> JsonResponse:
    logger.exception("api_internal_error path=%s", request.path)
    return _json(request, 500, body("internal_error", "the API failed to answer; the error is in the web log"))


@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    """Any other path under /api/: a JSON 404, never Django's HTML page."""
    return _json(request, 404, body("not_found", f"no API endpoint at {request.path}; see /api/v1/openapi.json"))


def _in_scope(caller: Caller, task_type: str) -> None:
    if not caller.may_dispatch(task_type):
        allowed = ", ".join(sorted(caller.allowed_types)) or "none"
        raise ApiError(403, "forbidden_type",
                       f"token '{caller.name}' may not dispatch task type {task_type!r} (allowed: {allowed})")


def _audit(request: HttpRequest, caller: Caller, endpoint: str, task_type: str,
           results: list[DispatchResult]) -> None:
    """One row per request (not per item): who sent what, how much was admitted, why the rest was not."""
    accepted = [r for r in results if r.accepted]
    DispatchAudit.objects.create(
        token_id=caller.token_id, token_name=caller.name, endpoint=endpoint, task_type=task_type[:100],
        items=len(results), accepted=len(accepted),
        reasons=dict(Counter(r.reason for r in results if not r.accepted and r.reason)),
        task_ids=[r.task_id for r in accepted[:AUDIT_MAX_TASK_IDS]],
        remote_addr=(request.META.get("REMOTE_ADDR") or "")[:64],
    )


def _check_policy(caller: Caller, policy: str | None) -> None:
    if policy is not None and policy not in caller.retry_policies:
        allowed = ", ".join(sorted(caller.retry_policies)) or "none"
        raise ApiError(403, "forbidden_retry_policy",
                       f"token '{caller.name}' may not name retry policy {shown(policy, 80)} (allowed: {allowed})")


def _room(caller: Caller, task_type: str) -> tuple[tenancy.Room | None, DispatchResult | None]:
    """The caller's room for ``task_type``, or the rejection every item gets (unknown type, Redis down).

    Nothing reaches admission without its namespace: a type the cached config does
    not know is looked for once more, then refused here.
    """
    try:
        snap = config.current()
        tc = snap.types.get(task_type)
        if tc is None:
            snap = config.refresh_if_changed()
            tc = snap.types.get(task_type)
    except redis.RedisError as exc:
        return None, unavailable(exc, None)
    if tc is None:
        return None, rejected_invalid(snap, task_type, Invalid("unknown_type", f"no task type named {task_type!r}"))
    max_delay = tc.max_delay_s if tc.max_delay_s is not None else tc.timeout_s
    return tenancy.Room(caller.token_id, tc.shared, tc.timeout_s, max_delay), None


def _scoped(room: tenancy.Room, options: dict[str, Any], now: float) -> tuple[dict[str, Any], DispatchResult | None]:
    try:
        return room.scoped(options, now_s=now), None
    except Invalid as exc:
        return options, DispatchResult(False, reason=exc.reason, detail=exc.detail)


def _shown(room: tenancy.Room, result: DispatchResult, options: dict[str, Any]) -> DispatchResult:
    if not result.accepted and result.detail:
        result.detail = room.shown(result.detail, options)
    return result


def _retry_headers(status: int) -> dict[str, str]:
    return {"Retry-After": str(statuses.RETRY_AFTER_S)} if status in (429, 503) else {}


@api.post("/dispatch", response={202: DispatchOut, 404: DispatchOut, 409: DispatchOut, 503: DispatchOut,
                                 **REFUSALS}, summary="Dispatch one task")
def dispatch_one(request: HttpRequest, data: DispatchIn) -> JsonResponse:
    """Admit one task, as ``dispatch.delay`` does: 202 with its ``task_id``, or a rejection with a ``reason``.

    ``countdown`` / ``eta`` send it for later, ``retry_policy`` names the policy its retries follow.
    Rejections: 404 ``unknown_type``; 422 ``invalid_*``, ``unknown_retry_policy``; 413 ``payload_too_large``;
    409 ``type_disabled``, ``idempotency_conflict``; 429 ``lane_full``, ``chat_queue_full``, ``caller_quota``
    (the token holds its share of the lane: ``ServiceToken.lane_share``), each with ``Retry-After``;
    503 ``lane_closed``, ``unavailable`` (retry with the same idempotency key).
    """
    caller: Caller = request.auth
    _in_scope(caller, data.task_type)
    _check_policy(caller, data.retry_policy)
    room, refused = _room(caller, data.task_type)
    result = refused
    if room is not None:
        options = {"chat_id": data.chat_id, "priority": data.priority, "idempotency_key": data.idempotency_key,
                   "timeout": data.timeout, "metadata": data.metadata, "limit_key": data.limit_key,
                   "countdown": data.countdown, "eta": data.eta, "retry_policy": data.retry_policy,
                   "dedupe_key": data.dedupe_key}
        scoped, result = _scoped(room, options, time.time())
        if result is None:
            task_id = tenancy.task_id_prefix(caller.token_id) + str(uuid.uuid4())
            with tracing.remote_parent(request.headers):  # a W3C traceparent header: the dispatch's parent
                result = _shown(room, admit(data.task_type, data.payload, _task_id=task_id,
                                            _lane_share=caller.lane_share, **scoped), options)
    assert result is not None
    _audit(request, caller, "dispatch", data.task_type, [result])
    status = statuses.status_for(result.accepted, result.reason)
    return _json(request, status, result.as_dict(), _retry_headers(status))


def _item_options(item: Any) -> tuple[Any, dict[str, Any]]:
    """``(payload, per-item options)``: a wrapper object when it has "payload" and only item keys."""
    if isinstance(item, dict) and "payload" in item and item.keys() <= ITEM_KEYS:
        options = {k: item[k] for k in ("chat_id", "priority", "idempotency_key", "limit_key", "dedupe_key")
                   if k in item}
        return item["payload"], options
    return item, {}


@api.post("/dispatch/bulk", response={200: BulkOut, **REFUSALS}, summary="Dispatch many tasks of one type")
def dispatch_bulk(request: HttpRequest, data: BulkIn) -> JsonResponse:
    """Admit each item on its own; ``results`` are in input order (at most 1000 items per request).

    An item is refused as a single dispatch would be, with its ``reason``: e.g. ``caller_quota`` once the
    token holds its share of the lane.
    """
    # The items go to Redis together (dispatch_many: one round trip per chunk of 500), not one call each.
    caller: Caller = request.auth
    _in_scope(caller, data.task_type)
    _check_policy(caller, data.retry_policy)
    _charge(caller, len(data.items))
    room, refused = _room(caller, data.task_type)
    if room is None:
        assert refused is not None
        results = [refused] * len(data.items)
    else:
        with tracing.remote_parent(request.headers):
            results = _bulk(caller, room, data)
    _audit(request, caller, "bulk", data.task_type, results)
    accepted = sum(1 for r in results if r.accepted)
    return _json(request, 200, {"accepted": accepted, "rejected": len(results) - accepted,
                                "results": [r.as_dict() for r in results]})


def _charge(caller: Caller, items: int) -> None:
    """A bulk request counts each of its items against the token's rate (the request itself was counted)."""
    retry_after = ratelimit.check(caller.token_id, caller.rate_per_s, cost=items - 1) if items > 1 else None
    if retry_after is not None:
        raise ApiError(429, "rate_limited",
                       f"token '{caller.name}' is over its rate of {caller.rate_per_s} tasks/s: a bulk request "
                       f"counts each of its {items} items; nothing was admitted", {"Retry-After": str(retry_after)})


def _bulk(caller: Caller, room: tenancy.Room, data: BulkIn) -> list[DispatchResult]:
    now = time.time()
    results: list[DispatchResult | None] = [None] * len(data.items)
    raw: list[dict[str, Any]] = []
    pairs, sent = [], []
    for index, item in enumerate(data.items):
        payload, options = _item_options(item)
        options.setdefault("priority", data.priority)
        for name in ("countdown", "eta", "retry_policy", "timeout", "metadata"):  # the call's, unless the item's
            if getattr(data, name) is not None:
                options.setdefault(name, getattr(data, name))
        raw.append(options)
        scoped, refused = _scoped(room, options, now)
        if refused is not None:
            results[index] = refused
            continue
        pairs.append((payload, scoped))
        sent.append(index)
    admitted = dispatch_many(data.task_type, pairs, id_prefix=tenancy.task_id_prefix(caller.token_id),
                             lane_share=caller.lane_share)
    for index, result in zip(sent, admitted, strict=True):
        results[index] = _shown(room, result, raw[index])
    return results  # type: ignore[return-value]  # every slot is filled above


def _decode(row: TaskResult) -> Any:
    if row.result is None:
        return None
    try:
        return json.loads(row.result)
    except (TypeError, ValueError):
        return row.result


def _own_task(caller: Caller, task_id: str, *, to_cancel: bool = False) -> None:
    """404 ``unknown_task`` for an id this caller did not make: the same answer as for an id never dispatched."""
    if not 0 < len(task_id) <= MAX_TASK_ID_LEN or not task_id.isprintable():
        raise ApiError(422, "invalid_request", f"task_id must be 1..{MAX_TASK_ID_LEN} printable characters")
    mine = tenancy.owns(caller.token_id, task_id) if to_cancel else caller.may_read(task_id)
    if not mine or not cancelling.valid_task_id(task_id):
        raise _unknown_task(task_id)


def _unknown_task(task_id: str) -> ApiError:
    return ApiError(404, "unknown_task", f"no task {task_id!r} was dispatched by this token")


#: A live record's state (``st``, lanes/lua/_lib.lua) as the API names it; any other: PENDING.
RECORD_STATES = {"scheduled": "SCHEDULED", "running": "STARTED", "retry": "RETRY"}


def _live_state(task_id: str) -> str | None:
    """The state of a task Redis still holds (None: it holds none); ``ApiError`` 503 if Redis does not answer."""
    try:
        client = get_redis()
        record = records.locate(client, task_id)
        if record is None:
            return None
        state = client.hget(record, "st")
    except redis.RedisError as exc:
        raise ApiError(503, "unavailable", f"Redis did not answer ({exc}); retry", {"Retry-After": "1"}) from None
    if state is None:
        return None
    return RECORD_STATES.get(state.decode() if isinstance(state, bytes) else str(state), "PENDING")


@api.get("/tasks/{task_id}", response={200: TaskStateOut, 401: ErrorOut, 404: ErrorOut, 422: ErrorOut,
                                       429: ErrorOut, 503: ErrorOut},
         summary="A task's state and result")
def task_state(request: HttpRequest, task_id: str, history: bool = False) -> JsonResponse:
    """The state of one of this token's tasks, its last progress and, if it died, its dead letter.

    ``progress`` is the handler's last ``ctx.progress`` (``{fraction, note, at}``) or null.
    ``?history=1`` adds ``history``: dispatched (by whom, with which options), waiting
    (lane, chat position), each attempt (worker, start, end, outcome, error, retry delay),
    cancel, dead letter and result.

    ``SCHEDULED`` while it waits for its countdown / eta, ``PENDING`` while it
    waits for a worker, then Celery's states. 404 ``unknown_task`` for an id never
    dispatched, and for another token's task (the same answer).
    """
    _own_task(request.auth, task_id)
    row = TaskResult.objects.filter(task_id=task_id).first()
    result = _decode(row) if row else None
    dead = DeadLetter.objects.filter(task_id=task_id).first()
    dispatched = None
    if row and row.task_name == "tasks.dispatch" and isinstance(result, dict):
        dispatched = result.get("task_id") if result.get("accepted") else None
    state = row.status if row else None
    if state is None:
        state = _live_state(task_id) or ("PENDING" if dead else None)
    if state is None:
        raise _unknown_task(task_id)
    try:
        progress = task_history.read_progress(get_redis(), task_id)
        story = task_history.read(task_id) if history else None
    except redis.RedisError as exc:
        raise ApiError(503, "unavailable", f"Redis did not answer ({exc}); retry", {"Retry-After": "1"}) from None
    return _json(request, 200, {
        "task_id": task_id,
        "state": state,
        "task_name": row.task_name if row else None,
        "result": result,
        "date_done": row.date_done.isoformat() if row and row.date_done else None,
        "dispatched_task_id": dispatched,
        "dead_letter": None if dead is None else {
            "reason": dead.reason, "status": dead.status, "error": dead.error_message,
            "attempts": dead.attempts, "requeued_task_id": dead.requeued_task_id,
        },
        "progress": progress,
        **({"history": story.as_dict() if story else None} if history else {}),
    })


#: A cancel's outcome -> HTTP status: took effect 200; already ended 409; no such task 404 (as manage.py cancel).
CANCEL_STATUS = {"cancelled": 200, "running_told": 200, "already_cancelled": 200, "already_done": 409,
                 "already_dead": 409, "unknown": 404, "invalid": 422, "unavailable": 503}


@api.post("/tasks/{task_id}/cancel", response={200: CancelOut, 404: ErrorOut, 409: CancelOut, 401: ErrorOut,
                                               422: ErrorOut, 429: ErrorOut, 503: CancelOut},
          summary="Cancel one of this token's tasks")
def task_cancel(request: HttpRequest, task_id: str, data: CancelIn | None = None) -> JsonResponse:
    """Cancel a task this token dispatched, as ``manage.py cancel`` does.

    200 when it took effect (``cancelled``: it waited and never runs; ``running_told``: its handler is
    told; ``already_cancelled``); 409 ``already_done`` / ``already_dead``; 404 ``unknown_task`` (never
    dispatched, another token's, or ended long ago); 503 ``unavailable`` (nothing known: send again).
    """
    caller: Caller = request.auth
    _own_task(caller, task_id, to_cancel=True)
    found = cancelling.cancel_task(task_id, data.reason if data else "", by=f"api token '{caller.name}'")
    status = CANCEL_STATUS.get(found.outcome, 422)
    if found.outcome == "unknown":
        raise _unknown_task(task_id)
    return _json(request, status, found.as_dict(), _retry_headers(status))
