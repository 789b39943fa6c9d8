"""Every answer under ``/api/`` is JSON: a refusal made outside the API's own handlers is rewritten.

Django and django-ninja answer a few refusals themselves before any API code
runs: a wrong method (405, plain text), a CSRF failure (403, an HTML page).
A service reading the API parses JSON; this turns those into the API's one
error shape (``{"reason", "detail"}``), keeping the status and ``Allow``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

#: Reason of each status Django may answer on its own.
REASONS = {400: "invalid_request", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
           413: "body_too_large"}


class JsonErrorsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith("/api/") or response.status_code < 400:
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        status = response.status_code
        detail = {405: f"{request.method} is not allowed here; allowed: {response.get('Allow', 'none')}",
                  403: "refused before the API read the request (a browser's cookie without its CSRF token?); "
                       "send 'Authorization: Bearer <token>' and no session cookie"}.get(status, f"HTTP {status}")
        rewritten = HttpResponse(json.dumps({"reason": REASONS.get(status, "error"), "detail": detail}),
                                 status=status, content_type="application/json")
        for name in ("Allow", "Retry-After", "WWW-Authenticate"):
            if name in response:
                rewritten[name] = response[name]
        return rewritten
