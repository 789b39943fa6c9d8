"""The admin pages of Lane and LaneEvent: the lane list with its workers column and the lane-control actions."""

from __future__ import annotations

from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.urls import reverse

from lanes.config_admin import ConfigSaveWarningMixin
from lanes.models import Lane, LaneEvent
from ops import control


def _control_action(action: str, description: str):
    """An admin action that shows a confirmation page first, then applies ``action`` to each lane."""

    def run(modeladmin: LaneAdmin, request, queryset):
        lanes = list(queryset)
        if request.POST.get("confirm") != "yes":
            from ops.views import CONFIRM_TEXT

            context = {
                **modeladmin.admin_site.each_context(request),
                "title": f"{action.capitalize()} {len(lanes)} lane{'s' if len(lanes) != 1 else ''}?",
                "lanes": lanes, "action": action, "action_name": f"lane_{action}",
                "explanation": CONFIRM_TEXT[action], "from_changelist": True, "form_url": "",
                "cancel_url": reverse("admin:lanes_lane_changelist"), "opts": modeladmin.model._meta,
            }
            return TemplateResponse(request, "admin/lanes/control_confirm.html", context)
        for lane in lanes:
            try:
                outcome = control.apply(action, lane.name, request.user.get_username())
            except control.ControlError as exc:
                modeladmin.message_user(request, str(exc), messages.ERROR)
            else:
                modeladmin.message_user(request, outcome.message, messages.SUCCESS)
        return None

    run.__name__ = f"lane_{action}"
    return admin.action(description=description, permissions=["control"])(run)


def _workers_column():
    """A changelist column: live workers holding each lane, or a warning that none does."""
    import time

    from django.utils.html import format_html

    from lanes import consumers
    from lanes.redis_client import get_redis

    cache: dict[str, list[str]] = {}

    def workers(lane: Lane) -> str:
        if lane.name not in cache:
            try:
                names = list(Lane.objects.values_list("name", flat=True))
                cache.update(consumers.read_holders(get_redis(), names, time.time()))
            except Exception:  # noqa: BLE001 - Redis down: say so in the cell, keep the page
                return "unknown (Redis unreachable)"
        holders = cache.get(lane.name, [])
        if not holders:
            return format_html('<strong class="no-consumer-warning">{}</strong>', "no worker consumes this lane")
        return format_html("{} ({})", len(holders), ", ".join(holders))

    workers.short_description = "workers"
    return workers


@admin.register(Lane)
class LaneAdmin(ConfigSaveWarningMixin, admin.ModelAdmin):
    list_display = ("name", "capacity", "accepting", "description")
    list_editable = ("accepting",)
    search_fields = ("name",)
    actions = (
        _control_action("close", "Close admission of selected lanes (dispatch answers lane_closed)"),
        _control_action("open", "Open admission of selected lanes"),
        _control_action("pause", "Pause consumption of selected lanes (workers stop taking their tasks)"),
        _control_action("resume", "Resume consumption of selected lanes"),
        _control_action("drain", "Drain selected lanes (close, then let them empty)"),
    )

    class Media:
        css = {"all": ("lanes/dashboard.css",)}  # the "no worker" warning's colour: no inline style under the CSP

    def get_list_display(self, request):
        """The list plus a "Workers" column from the workers' heartbeats (one Redis read per page)."""
        return (*super().get_list_display(request), _workers_column())

    def has_control_permission(self, request) -> bool:
        return request.user.has_perm("lanes.control_lane")

    def get_changelist_instance(self, request):
        """Only users with the lane-control permission get the editable ``accepting`` column (and its POST)."""
        changelist = super().get_changelist_instance(request)
        if not self.has_control_permission(request):
            changelist.list_editable = ()
        return changelist

    def get_readonly_fields(self, request, obj=None):
        """Opening or closing a lane in its form needs the lane-control permission too."""
        fields = tuple(super().get_readonly_fields(request, obj))
        if obj is not None and not self.has_control_permission(request):
            fields += ("accepting",)
        return fields

    def save_model(self, request, obj, form, change):
        """Log an admission change made through the form or the list's checkbox, like the actions do."""
        before = Lane.objects.filter(pk=obj.pk).values_list("accepting", flat=True).first() if change else None
        super().save_model(request, obj, form, change)
        if change and before is not None and before != obj.accepting:
            control.log(obj.name, "open" if obj.accepting else "close", request.user.get_username(),
                        "changed in the lane form")


@admin.register(LaneEvent)
class LaneEventAdmin(admin.ModelAdmin):
    list_display = ("created", "lane", "action", "actor", "detail")
    list_filter = ("lane", "action")
    readonly_fields = ("created", "lane", "action", "actor", "detail")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
