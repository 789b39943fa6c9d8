"""The demo webhook receiver: where ``make run``'s ``chat.send`` type posts, so the README's examples succeed.

It stands in for a partner's endpoint on a development install: any JSON POST
is answered ``200 {"received": true}``, and nothing is stored. It is part of the
tools app, so the production profile does not serve it.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

#: The path the default configuration's ``chat.send`` posts to.
PATH = "demo/hook"


@csrf_exempt  # a webhook receiver is called by the platform's http.post, never by a browser form
@require_POST
def receive(request: HttpRequest) -> JsonResponse:
    """Answer 200 to a POST, as a receiver that accepted the message would."""
    return JsonResponse({"received": True, "task_id": request.headers.get("X-Dispatch-Task-Id", "")})
