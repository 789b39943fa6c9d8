from __future__ import annotations

from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html

from api.models import DispatchAudit, ServiceToken


@admin.register(ServiceToken)
class ServiceTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "token_prefix", "types", "rate_per_s", "lane_share", "created_at", "last_used_at",
                    "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "task_types")
    search_fields = ("name", "prefix", "notes")
    filter_horizontal = ("task_types", "retry_policies")
    readonly_fields = ("token_prefix", "created_at", "last_used_at", "revoked_at")
    fields = ("name", "notes", "task_types", "rate_per_s", "lane_share", "retry_policies", "reads_broker_tasks",
              "token_prefix", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("task_types")

    @admin.display(description="token")
    def token_prefix(self, obj: ServiceToken) -> str:
        return f"dsp_{obj.prefix}_…" if obj.prefix else "(made when saved)"

    @admin.display(description="allowed task types")
    def types(self, obj: ServiceToken) -> str:
        return ", ".join(t.name for t in obj.task_types.all()) or "none"

    def save_model(self, request, obj: ServiceToken, form, change: bool) -> None:
        clear = None if change else obj.set_new_secret()
        super().save_model(request, obj, form, change)
        if clear:
            # Shown once: only its SHA-256 is stored.
            messages.warning(request, format_html(
                "Token for {}: <code>{}</code> Copy it now: it is not stored and will not be shown again.",
                obj.name, clear))

    @admin.action(description="Revoke selected tokens (refused from now on)", permissions=["change"])
    def revoke(self, request, queryset) -> None:
        """Needs "Can change service token" (a view-only user gets no such action, and a forged POST is refused)."""
        rows = list(queryset.filter(revoked_at__isnull=True))
        now = timezone.now()
        for row in rows:
            row.revoked_at = now
            row.save(update_fields=["revoked_at"])
            self.log_change(request, row, "Revoked the token (refused from now on).")
        self.message_user(request, f"Revoked {len(rows)} token(s).", messages.SUCCESS)


@admin.register(DispatchAudit)
class DispatchAuditAdmin(admin.ModelAdmin):
    list_display = ("created_at", "token_name", "endpoint", "task_type", "items", "accepted", "reasons",
                    "remote_addr")
    list_filter = ("endpoint", "token_name", "task_type")
    search_fields = ("token_name", "task_type", "remote_addr")
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in DispatchAudit._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # an audit is read, never edited

    def has_delete_permission(self, request, obj=None):
        return False
