"""The operator's pages: ``/metrics``, the admin dashboard, lane controls, and Flower's auth check."""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lanes.models import Lane, LaneEvent
from ops import charts, control, metrics, schedules_panel
from ops import task_history as history_page
from ops import task_search as search
from tasks import cancel as cancelling

logger = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"

CONFIRM_TEXT = {
    "close": "Dispatch will answer lane_closed for every new task of this lane. Tasks already waiting still run.",
    "open": "Dispatch will accept new tasks of this lane again.",
    "pause": "Every worker stops taking tasks from this lane (running tasks finish). New tasks wait in the lane.",
    "resume": "The workers that were paused take tasks from this lane again.",
    "drain": "Admission closes now; the dashboard shows what is left until the lane and its retries are empty. "
             "The lane stays closed afterwards until you open it.",
}


def _bearer_ok(request: HttpRequest) -> bool:
    token = settings.DISPATCH_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape: the bearer token from DISPATCH_METRICS_TOKEN, or a staff session."""
    user = request.user
    if not (_bearer_ok(request) or (user.is_authenticated and user.is_active and user.is_staff)):
        response = HttpResponse("authentication required: Authorization: Bearer <DISPATCH_METRICS_TOKEN>\n",
                                status=401, content_type=TEXT)
        response["WWW-Authenticate"] = 'Bearer realm="dispatch metrics"'
        return response
    from ops.prometheus import registry

    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)


def _text(body: str, status: int) -> HttpResponse:
    """A plain-text answer: whatever the URL carried is never read as HTML."""
    return HttpResponse(body, status=status, content_type=TEXT)


#: Flower can shut workers down, revoke tasks and read every payload: being
#: staff is not enough, the user needs this permission (superusers have all).
FLOWER_PERMISSION = "lanes.use_flower"


def flower_auth(request: HttpRequest) -> HttpResponse:
    """For a reverse proxy's ``auth_request``: 204 with the Flower permission, 403 without, 401 logged out."""
    user = request.user
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return HttpResponse(status=401)
    if not user.has_perm(FLOWER_PERMISSION):
        return _text("you need the 'Can use Flower' permission\n", 403)
    return HttpResponse(status=204)


def _can_control(request: HttpRequest) -> bool:
    return request.user.has_perm("lanes.control_lane")


#: Cancelling tasks and chats (the task search page, the dashboard's top chats).
CANCEL_PERMISSION = "lanes.cancel_task"


def _can_cancel(request: HttpRequest) -> bool:
    return request.user.has_perm(CANCEL_PERMISSION)


def _live_context(request: HttpRequest) -> dict:
    snap = metrics.snapshot()
    now = snap["generated_at"]
    for lane in snap["lanes"]:
        lane["chart"] = charts.lane_chart(lane["name"], lane["series"], now)
        lane["deadletter_url"] = (reverse("admin:tasks_deadletter_changelist")
                                  + f"?lane__exact={lane['name']}&status__exact=dead")
        s = lane["stats"]
        s["queue_latency_p50"] = metrics.format_seconds(s["queue_latency_p50_s"])
        s["queue_latency_p95"] = metrics.format_seconds(s["queue_latency_p95_s"])
        fail = s["failure_rate_15m"]
        s["failure_pct"] = f"{fail * 100:.1f}%" if fail is not None else "-"
        for kind in ("dispatched", "completed"):
            s[f"{kind}_rates"] = {w: metrics.format_rate(v) for w, v in s[f"{kind}_per_s"].items()}
    for lim in snap["limits"]:
        for kind in ("admitted", "throttled"):
            lim[f"{kind}_rates"] = {f"{w}m": metrics.format_rate(lim[f"{kind}_per_s"].get(f"{w}m", 0.0))
                                    for w in metrics.RATE_WINDOWS}
        now_rate = lim["admitted_per_s"].get("now")
        lim["admitted_now"] = "-" if now_rate is None else metrics.format_rate(now_rate)
    return {
        "snap": snap,
        "can_control": _can_control(request),
        "can_cancel": _can_cancel(request),
        "search_url": reverse("dispatch-task-search"),
        "flower_url": settings.FLOWER_URL,
        "events": list(LaneEvent.objects.all()[:10]),
        "schedules": schedules_panel.rows(),
        "deadletters_url": reverse("admin:tasks_deadletter_changelist") + "?status__exact=dead",
    }


def dashboard(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Dispatch dashboard",
        "is_nav_sidebar_enabled": False,  # the lane table needs the width
        "live": render_to_string("admin/lanes/_dashboard_live.html", _live_context(request), request=request),
        "data_url": reverse("dispatch-dashboard-data"),
        "flower_url": settings.FLOWER_URL,
    }
    return TemplateResponse(request, "admin/lanes/dashboard.html", context)


def dashboard_data(request: HttpRequest) -> JsonResponse:
    """What the page's script polls: the live part as HTML, and the numbers as data."""
    context = _live_context(request)
    html = render_to_string("admin/lanes/_dashboard_live.html", context, request=request)
    snap = context["snap"]
    for lane in snap["lanes"]:
        lane.pop("chart", None)
    return JsonResponse({"html": html, "data": snap})


@require_http_methods(["GET", "POST"])
def lane_control(request: HttpRequest, name: str, action: str) -> HttpResponse:
    """GET: the confirmation page; POST: apply, log who did it, back to the dashboard."""
    if not _can_control(request):
        return _text("you need the 'Can close, open, pause, resume and drain lanes' permission\n", 403)
    if action not in control.ACTIONS:
        return _text(f"unknown action {action!r}\n", 404)
    lane = Lane.objects.filter(name=name).first()
    if lane is None:
        return _text(f"no lane named {name!r}\n", 404)
    back = reverse("dispatch-dashboard")
    if request.method == "POST":
        try:
            outcome = control.apply(action, name, request.user.get_username())
        except control.ControlError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, outcome.message)
        return redirect(back)
    context = {
        **admin.site.each_context(request),
        "title": f"{action.capitalize()} lane {name}?",
        "lanes": [lane],
        "action": action,
        "explanation": CONFIRM_TEXT[action],
        "cancel_url": back,
        "form_url": request.path,
        "from_changelist": False,
    }
    return TemplateResponse(request, "admin/lanes/control_confirm.html", context)


@require_http_methods(["GET", "POST"])
def task_search(request: HttpRequest) -> HttpResponse:
    """Find a task by id, a chat's queue, or a task by idempotency key; POST cancels (with the cancel permission)."""
    if not _can_cancel(request):
        return _text("you need the 'Can cancel tasks and chats' permission\n", 403)
    if request.method == "POST":
        return _cancel_from_search(request)
    kind = request.GET.get("kind", "task")
    q = request.GET.get("q", "").strip()
    task_type = request.GET.get("type", "").strip()
    rows: list[search.TaskRow] = []
    searched = bool(q)
    if q and kind == "task":
        found = search.task(q)
        rows = [found] if found else []
    elif q and kind == "chat":
        rows = search.chat(q)
    elif q and kind == "key":
        found = search.by_key(task_type, q)
        rows = [found] if found else []
    context = {
        **admin.site.each_context(request),
        "title": "Find and cancel tasks",
        "kind": kind if kind in search.KINDS else "task",
        "q": q,
        "task_type": task_type,
        "rows": rows,
        "searched": searched,
        "chat": q if kind == "chat" and rows else "",
        "form_url": reverse("dispatch-task-search"),
    }
    return TemplateResponse(request, "admin/lanes/task_search.html", context)


def _cancel_from_search(request: HttpRequest) -> HttpResponse:
    """POST of a search row's (or a chat's) cancel button: cancel, say what it found, back to the search."""
    by = f"admin:{request.user.get_username()}"
    reason = request.POST.get("reason", "")[: cancelling.MAX_REASON_LEN]
    chat_id = request.POST.get("chat", "")
    task_id = request.POST.get("task_id", "")
    if chat_id:
        found = cancelling.cancel_chat(chat_id, reason, by=by)
        counts: dict[str, int] = {}
        for r in found:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "nothing queued"
        messages.success(request, f"chat {chat_id}: {summary}")
        back = f"{reverse('dispatch-task-search')}?{urlencode({'kind': 'chat', 'q': chat_id})}"
    else:
        # The row's chat, when it showed one: the record is found in one step, not searched for.
        result = cancelling.cancel_task(task_id, reason, by=by, chat_id=request.POST.get("task_chat") or None)
        level = messages.success if result.outcome in ("cancelled", "running_told") else messages.warning
        level(request, f"task {result.task_id}: {result.outcome} ({result.detail})")
        back = f"{reverse('dispatch-task-search')}?{urlencode({'kind': 'task', 'q': task_id})}"
    return redirect(back)


@require_http_methods(["GET", "POST"])
def lane_purge(request: HttpRequest, name: str) -> HttpResponse:
    """Cancel everything waiting in a lane: the lane-control permission and the lane's name typed to confirm."""
    if not _can_control(request):
        return _text("you need the 'Can close, open, pause, resume and drain lanes' permission\n", 403)
    lane = Lane.objects.filter(name=name).first()
    if lane is None:
        return _text(f"no lane named {name!r}\n", 404)
    error = ""
    if request.method == "POST":
        if request.POST.get("confirm", "") == name:
            actor = request.user.get_username()
            summary = cancelling.purge_lane(name, request.POST.get("reason", "") or "lane purge", by=f"admin:{actor}")
            control.log(name, "purge", actor, f"cancelled {summary.cancelled} waiting task(s): {summary.counts}")
            messages.success(request, f"lane {name}: {summary.cancelled} waiting task(s) cancelled")
            return redirect(reverse("dispatch-dashboard"))
        error = f"type the lane's name ({name}) to confirm"
    context = {
        **admin.site.each_context(request),
        "title": f"Purge the queued tasks of lane {name}?",
        "lane": lane,
        "error": error,
        "accepting": lane.accepting,
        "cancel_url": reverse("dispatch-dashboard"),
        "form_url": request.path,
    }
    return TemplateResponse(request, "admin/lanes/purge_confirm.html", context, status=400 if error else 200)


def task_history(request: HttpRequest, task_id: str) -> HttpResponse:
    """One task's history: dispatched, waiting, each attempt, retries, cancel, dead letter, result, progress."""
    found = history_page.page(task_id)
    context = {
        **admin.site.each_context(request),
        "title": f"Task {task_id}",
        "task_id": task_id,
        "task": found,
        "search_url": reverse("dispatch-task-search"),
    }
    return TemplateResponse(request, "admin/lanes/task_history.html", context, status=200 if found else 404)
