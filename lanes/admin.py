from __future__ import annotations

from django.contrib import admin

from lanes.models import Lane, LaneEvent


@admin.register(Lane)
class LaneAdmin(admin.ModelAdmin):
    list_display = ("name", "capacity", "accepting", "description")
    list_editable = ("accepting",)
    search_fields = ("name",)


@admin.register(LaneEvent)
class LaneEventAdmin(admin.ModelAdmin):
    list_display = ("created", "lane", "action", "actor", "detail")
    list_filter = ("lane", "action")
    readonly_fields = ("created", "lane", "action", "actor", "detail")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
