from __future__ import annotations

import json

from django.contrib import admin, messages
from django.utils.html import format_html

from tasks import dead_letters
from tasks.models import DeadLetter, RetryPolicy, TaskType


@admin.register(RetryPolicy)
class RetryPolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "max_retries", "initial_backoff", "multiplier", "max_backoff", "jitter")
    search_fields = ("name",)


@admin.register(TaskType)
class TaskTypeAdmin(admin.ModelAdmin):
    list_display = ("name", "handler", "lane", "priority", "chat_scoped", "timeout", "attempt_timeout", "enabled")
    list_filter = ("lane", "handler", "chat_scoped", "enabled")
    search_fields = ("name",)
    fieldsets = (
        (None, {"fields": ("name", "handler", "lane", "priority", "enabled", "options")}),
        ("Time and retries", {"fields": ("timeout", "attempt_timeout", "retry_policy")}),
        ("Ordering and bounds", {"fields": ("chat_scoped", "chat_queue_size", "max_payload_bytes",
                                            "idempotency_window")}),
    )


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

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not _can_resolve(request):
            actions.pop("requeue", None)
            actions.pop("discard", None)
        return actions

    @admin.display(description="task")
    def task_link(self, obj):
        if obj.requeued_task_id:
            return format_html("{} → {}", obj.task_id[:8], obj.requeued_task_id[:8])
        return obj.task_id[:8]

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return format_html("<pre>{}</pre>", json.dumps(obj.payload, indent=2, ensure_ascii=False))

    @admin.display(description="metadata")
    def metadata_pretty(self, obj):
        return format_html("<pre>{}</pre>", json.dumps(obj.metadata, indent=2, ensure_ascii=False))

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
