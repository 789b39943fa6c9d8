"""``Authorization: Bearer <token>``: who is calling, then body size and rate, before the body is read.

Ninja runs this before it parses the request body, so an unauthenticated or
oversized request costs one header check and, at most, one token lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from api import ratelimit, tenancy, tokens
from api.errors import ApiError
from api.models import ServiceToken
from tasks import owners

#: Seconds between two writes of a token's ``last_used_at`` (not one write per request).
LAST_USED_RESOLUTION_S = 60


@dataclass(frozen=True)
class Caller:
    """The authenticated service of one request (``request.auth``)."""

    token_id: int
    name: str
    allowed_types: frozenset[str]
    rate_per_s: int
    #: Retry policies its dispatches may name.
    retry_policies: frozenset[str] = frozenset()
    #: Whether it also reads tasks no token made (sent by name through the broker).
    reads_broker_tasks: bool = False
    #: Per cent of each lane's capacity its tasks may hold (admission's ``caller_quota``).
    lane_share: int = 100

    def may_dispatch(self, task_type: str) -> bool:
        return task_type in self.allowed_types

    def may_read(self, task_id: str) -> bool:
        """Its own tasks; with ``reads_broker_tasks``, also those sent by name or by Python code."""
        if tenancy.owns(self.token_id, task_id):
            return True
        return self.reads_broker_tasks and owners.owner_of(task_id) == "python"


def _unauthorized(detail: str, reason: str = "unauthorized") -> ApiError:
    return ApiError(401, reason, detail, {"WWW-Authenticate": 'Bearer realm="dispatch"'})


class ServiceTokenAuth(HttpBearer):
    """Bearer auth against ``ServiceToken`` rows; a refusal raises ``ApiError`` naming why."""

    def __call__(self, request: HttpRequest) -> Caller:
        value = request.headers.get("Authorization", "")
        if not value:
            raise _unauthorized("missing Authorization header: send 'Authorization: Bearer <token>'")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("Authorization header must be 'Bearer <token>'")
        caller = self.authenticate(request, token.strip())
        _check_size(request)
        retry_after = ratelimit.check(caller.token_id, caller.rate_per_s)
        if retry_after is not None:
            raise ApiError(429, "rate_limited",
                           f"token '{caller.name}' is over its rate of {caller.rate_per_s} requests/s "
                           "(a bulk request counts each item)",
                           {"Retry-After": str(retry_after)})
        return caller

    def authenticate(self, request: HttpRequest, token: str) -> Caller:
        parsed = tokens.parse(token)
        if parsed is None:
            raise _unauthorized("malformed token: expected dsp_<prefix>_<secret>")
        prefix, secret = parsed
        row = ServiceToken.objects.filter(prefix=prefix).prefetch_related("task_types", "retry_policies").first()
        if row is None or not tokens.secret_matches(secret, row.secret_hash):
            raise _unauthorized("unknown token")
        if row.revoked_at is not None:
            raise _unauthorized(f"token '{row.name}' was revoked at {row.revoked_at.isoformat()}", "token_revoked")
        now = timezone.now()
        if row.last_used_at is None or now - row.last_used_at > timedelta(seconds=LAST_USED_RESOLUTION_S):
            ServiceToken.objects.filter(pk=row.pk).update(last_used_at=now)
        return Caller(row.pk, row.name, frozenset(t.name for t in row.task_types.all()), row.rate_per_s,
                      frozenset(p.name for p in row.retry_policies.all()), row.reads_broker_tasks, row.lane_share)


def _check_size(request: HttpRequest) -> None:
    limit = settings.DISPATCH_API_MAX_BODY_BYTES
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "invalid_request", "Content-Length is not a number")
    if length > limit:
        raise ApiError(413, "body_too_large", f"request body is {length} bytes; the API accepts at most {limit}")
