"""The Schedule admin: what fires, when (django-celery-beat's interval / crontab / one-off rows), and how it went."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django_celery_beat.models import PeriodicTask

from tasks.models import Schedule

# django-celery-beat's own PeriodicTask page is not served: a Schedule owns its PeriodicTask (each save
# rewrites it), and that page's actions declare no permission ("run" sends any task by name, past
# admission, for a user who may only view). Its interval, crontab and one-off pages stay.
if admin.site.is_registered(PeriodicTask):
    admin.site.unregister(PeriodicTask)


def json_kind(value: Any) -> str:
    """The JSON name of a decoded value's kind, for an error a user reads."""
    if isinstance(value, bool):
        return "true/false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "a number"
    return "an array" if isinstance(value, list) else "a string" if isinstance(value, str) else type(value).__name__


class PayloadField(forms.JSONField):
    """A JSON object, or an error that says what the text is instead."""

    default_error_messages = {"invalid": "Payload is not valid JSON: %(value)s"}

    def to_python(self, value: Any) -> Any:
        converted = super().to_python(value)
        if not isinstance(converted, dict):
            raise ValidationError(f"Payload must be a JSON object ({{...}}), not {json_kind(converted)}.",
                                  code="not_object")
        try:
            json.dumps(converted, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError("Payload must be valid Unicode: a lone surrogate escape such as \\ud800 is not.",
                                  code="invalid") from None
        return converted

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value, ensure_ascii=True)


class ScheduleForm(forms.ModelForm):
    payload = PayloadField(initial=dict, required=False,
                           help_text=Schedule._meta.get_field("payload").help_text)

    class Meta:
        model = Schedule
        fields = ("name", "task_type", "payload", "chat_id", "limit_key", "priority", "interval", "crontab",
                  "clocked", "missed", "enabled")

    def clean_payload(self) -> dict:
        value = self.cleaned_data.get("payload")
        return {} if value is None else value

    def _update_errors(self, errors: ValidationError) -> None:
        # A field the form refused already gets no second message from the model.
        if hasattr(errors, "error_dict"):
            kept = {f: m for f, m in errors.error_dict.items() if f not in self._errors}
            if not kept:
                return
            errors = ValidationError(kept)
        super()._update_errors(errors)


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ("name", "enabled", "task_type", "when", "missed", "next_fire_at", "last_outcome",
                    "last_reason", "fired_count", "refused_count", "skipped_count")
    list_filter = ("enabled", "missed", "last_outcome")
    search_fields = ("name", "task_type__name")
    list_select_related = ("task_type", "interval", "crontab", "clocked")
    readonly_fields = ("next_fire_at", "last_due_at", "last_fired_at", "last_outcome", "last_reason", "last_task_id",
                       "fired_count", "refused_count", "skipped_count")
    fieldsets = (
        (None, {"fields": ("name", "enabled", "task_type", "payload", "chat_id", "limit_key", "priority")}),
        ("When (one of)", {"fields": ("interval", "crontab", "clocked", "missed")}),
        ("Fires", {"fields": readonly_fields}),
    )

    @admin.display(description="when")
    def when(self, obj: Schedule) -> str:
        return str(obj.interval or obj.crontab or obj.clocked or "-")

    @admin.display(description="next fire")
    def next_fire_at(self, obj: Schedule) -> str:
        moment = obj.next_fire() if obj.pk else None
        return moment.isoformat(timespec="seconds") if moment else "-"
