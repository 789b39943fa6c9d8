from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import ValidationError
from django.http import HttpResponse, HttpResponseForbidden, HttpResponseNotAllowed, HttpResponseNotFound
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils.html import format_html

from lanes.config_admin import ConfigSaveWarningMixin
from tasks import dead_letters
from tasks.models import DeadLetter, Limit, RetryPolicy, TaskType


@admin.register(RetryPolicy)
class RetryPolicyAdmin(ConfigSaveWarningMixin, admin.ModelAdmin):
    list_display = ("name", "max_retries", "initial_backoff", "multiplier", "max_backoff", "jitter")
    search_fields = ("name",)


@admin.register(Limit)
class LimitAdmin(ConfigSaveWarningMixin, admin.ModelAdmin):
    list_display = ("name", "scope", "rate", "burst", "max_in_flight", "fair_share", "window")
    list_filter = ("scope", "fair_share")
    search_fields = ("name",)
    fieldsets = (
        (None, {"fields": ("name", "scope")}),
        ("Rate and concurrency", {"fields": ("rate", "burst", "max_in_flight")}),
        ("Fair share", {"fields": ("fair_share", "weights", "window")}),
    )


def json_text(value: object, indent: int | None = None) -> str:
    """JSON for a page: readable Unicode, but escaped where the text is no valid Unicode (a lone surrogate).

    ``"\\ud800"`` is valid JSON, yet the decoded string cannot be encoded as
    UTF-8: a page showing it as is would fail with a 500.
    """
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, indent=indent, ensure_ascii=True)
    return text


class OptionsField(forms.JSONField):
    """The options field: refuses text that is no valid Unicode, and always renders."""

    def to_python(self, value):
        converted = super().to_python(value)
        try:
            json.dumps(converted, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError("Options must be valid Unicode: a lone surrogate escape such as \\ud800 is not.",
                                  code="invalid") from None
        return converted

    def prepare_value(self, value):
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json_text(value)


class TaskTypeForm(forms.ModelForm):
    """The TaskType form: a field the form already refused gets no second message from the model.

    Invalid options JSON leaves the model's options at their default, and the
    model's ``clean()`` would then add a misleading "options.url is required".
    """

    options = OptionsField(required=False, initial=dict, help_text=TaskType._meta.get_field("options").help_text)
    # The type's limits as names in order (an inline would need its formset in every post of this form,
    # and a multiple choice keeps no order): checked against the defined limits.
    limit_names = forms.CharField(
        label="limits", required=False,
        help_text="Names of limits, comma-separated, checked in this order (a task starts when all admit it).")

    class Meta:
        model = TaskType
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk and not self.is_bound:
            self.initial["limit_names"] = ", ".join(self.instance.limit_names())
        # Fields left out of a post (a form from before batching, or before store_result) keep their defaults.
        for name in ("batch_size", "batch_window_ms", "store_result", "dedupe", "dedupe_window"):
            self.fields[name].required = False
        defined = list(Limit.objects.values_list("name", flat=True)[:50])
        if defined:
            self.fields["limit_names"].help_text += f" Defined: {', '.join(defined)}."

    def clean_batch_size(self) -> int:
        return self._or_default("batch_size")

    def clean_batch_window_ms(self) -> int:
        return self._or_default("batch_window_ms")

    def clean_store_result(self) -> str:
        return self._or_default("store_result")

    def clean_dedupe(self) -> str:
        return self._or_default("dedupe")

    def clean_dedupe_window(self) -> float:
        return self._or_default("dedupe_window")

    def _or_default(self, name: str) -> Any:
        value = self.cleaned_data.get(name)
        if value is None or value == "":
            current = getattr(self.instance, name, None) if self.instance.pk else None
            return current if current is not None else TaskType._meta.get_field(name).get_default()
        return value

    def clean_limit_names(self) -> list[Limit]:
        names = [n.strip() for n in (self.cleaned_data.get("limit_names") or "").split(",") if n.strip()]
        if len(set(names)) != len(names):
            raise ValidationError("A limit is named twice.")
        found = {limit.name: limit for limit in Limit.objects.filter(name__in=names)}
        missing = [n for n in names if n not in found]
        if missing:
            raise ValidationError(f"No limit named {', '.join(repr(n) for n in missing)}.")
        return [found[n] for n in names]

    def _update_errors(self, errors):
        if hasattr(errors, "error_dict"):
            kept = {field: msgs for field, msgs in errors.error_dict.items() if field not in self._errors}
            if not kept:
                return
            errors = ValidationError(kept)
        super()._update_errors(errors)


@admin.register(TaskType)
class TaskTypeAdmin(ConfigSaveWarningMixin, admin.ModelAdmin):
    form = TaskTypeForm
    # Enabled right after the name: the list scrolls sideways in its box, and the
    # last column was out of sight at 1,400 px with the sidebars.
    list_display = ("name", "enabled", "handler", "lane", "priority", "chat_scoped", "timeout", "attempt_timeout",
                    "batch_size")
    list_filter = ("lane", "handler", "chat_scoped", "shared", "enabled")
    search_fields = ("name",)
    fieldsets = (
        (None, {"fields": ("name", "handler", "lane", "priority", "enabled", "options")}),
        ("Limits", {"fields": ("limit_names",)}),
        ("Time and retries", {"fields": ("timeout", "attempt_timeout", "max_delay", "retry_policy")}),
        ("Ordering and bounds", {"fields": ("chat_scoped", "chat_queue_size", "max_payload_bytes",
                                            "idempotency_window")}),
        ("Callers", {"fields": ("shared",)}),
        ("Throttle and debounce", {"fields": ("dedupe", "dedupe_window")}),
        ("Results", {"fields": ("store_result",)}),
        ("Batching (batched handlers only)", {"fields": ("batch_size", "batch_window_ms")}),
    )


    def save_related(self, request, form, formsets, change) -> None:
        super().save_related(request, form, formsets, change)
        form.instance.set_limits(form.cleaned_data.get("limit_names") or [])


def _can_resolve(request) -> bool:
    return request.user.has_perm("tasks.requeue_deadletter")


@admin.register(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):
    list_display = ("died_at", "task_type", "lane", "reason", "status", "attempts", "chat_id", "task_link")
    list_filter = ("status", "reason", "task_type", "lane", ("died_at", admin.DateFieldListFilter))
    # Only lookups an index answers (task_id is unique, chat_id and idempotency_key
    # have indexes; on PostgreSQL Django adds a pattern-ops index for the prefix):
    # a "contains" search over the payload or error columns would scan the table.
    search_fields = ("task_id__exact", "chat_id__startswith", "idempotency_key__exact")
    search_help_text = "Exact task id, chat id prefix, or exact idempotency key (indexed lookups only)."
    date_hierarchy = "died_at"
    change_form_template = "admin/tasks/deadletter/change_form.html"
    actions = ("requeue", "discard")
    readonly_fields = [f.name for f in DeadLetter._meta.fields if f.name not in {"payload", "metadata",
                                                                                  "traceback"}] + [
        "payload_pretty", "metadata_pretty", "traceback_pretty"]
    exclude = ("payload", "metadata", "traceback")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # staff may look; rows change only through requeue and discard

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        extra = [path("<path:object_id>/requeue/", self.admin_site.admin_view(self.requeue_view),
                      name="tasks_deadletter_requeue")]
        return extra + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        row = self.get_object(request, unquote(object_id))
        extra_context = {
            **(extra_context or {}),
            "can_requeue": row is not None and row.status == DeadLetter.Status.DEAD and _can_resolve(request),
            "requeue_url": reverse("admin:tasks_deadletter_requeue", args=[quote(object_id)]),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def requeue_view(self, request, object_id: str) -> HttpResponse:
        """The detail page's Requeue button: POST only, with the requeue permission; back to the page with a message."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"], "POST to requeue\n", content_type="text/plain; charset=utf-8")
        if not _can_resolve(request):
            return HttpResponseForbidden("you need the 'Can requeue or discard dead letters' permission\n",
                                         content_type="text/plain; charset=utf-8")
        row = self.get_object(request, unquote(object_id))
        if row is None:
            return HttpResponseNotFound("no such dead letter\n", content_type="text/plain; charset=utf-8")
        try:
            new_id = dead_letters.requeue(row, actor=request.user.get_username())
        except dead_letters.RequeueError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(request, f"Dead letter {row.task_id} requeued as task {new_id}.", messages.SUCCESS)
        return redirect(reverse("admin:tasks_deadletter_change", args=[quote(object_id)]))

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not _can_resolve(request):
            actions.pop("requeue", None)
            actions.pop("discard", None)
        return actions

    @admin.display(description="task")
    def task_link(self, obj):
        # Each id opens its task's history page (ops.views.task_history).
        mine = format_html('<a href="{}" class="history-link">{}</a>',
                           reverse("dispatch-task-history", args=[obj.task_id]), obj.task_id[:8])
        if obj.requeued_task_id:
            again = format_html('<a href="{}" class="history-link">{}</a>',
                                reverse("dispatch-task-history", args=[obj.requeued_task_id]),
                                obj.requeued_task_id[:8])
            return format_html("{} → {}", mine, again)
        return mine

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return format_html("<pre>{}</pre>", json_text(obj.payload, indent=2))

    @admin.display(description="metadata")
    def metadata_pretty(self, obj):
        return format_html("<pre>{}</pre>", json_text(obj.metadata, indent=2))

    @admin.display(description="traceback")
    def traceback_pretty(self, obj):
        return format_html("<pre>{}</pre>", obj.traceback or obj.error_message)

    @admin.action(description="Requeue selected dead letters (new task, new deadline)", permissions=["requeue"])
    def requeue(self, request, queryset):
        self._resolve(request, queryset, "requeue")

    @admin.action(description="Discard selected dead letters", permissions=["requeue"])
    def discard(self, request, queryset):
        self._resolve(request, queryset, "discard")

    def has_requeue_permission(self, request):
        return _can_resolve(request)

    def _resolve(self, request, queryset, action: str) -> None:
        done, failed = 0, []
        for row in queryset:
            try:
                if action == "requeue":
                    dead_letters.requeue(row, actor=request.user.get_username())
                else:
                    dead_letters.discard(row, actor=request.user.get_username())
                done += 1
            except dead_letters.RequeueError as exc:
                failed.append(str(exc))
        if done:
            self.message_user(request, f"{action}d {done} dead letter(s).", messages.SUCCESS)
        for text in failed:
            self.message_user(request, text, messages.ERROR)


from tasks.admin_schedules import ScheduleAdmin  # noqa: E402,F401  (the Schedule admin, registered there)
