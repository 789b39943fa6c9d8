"""The admin's side of saving configuration (Lane, RetryPolicy, TaskType) while Redis may be down."""

from __future__ import annotations

from django.contrib import messages

from lanes.signals import ConfigVersionNotPublished, bump_failures_reported_to


class ConfigSaveWarningMixin:
    """A ModelAdmin mixin: a change whose config-version bump fails is kept, with a warning instead of a 500."""

    def _warn_on_bump_failure(self, request):
        def warn(exc: ConfigVersionNotPublished) -> None:
            text = str(exc)  # "the configuration change is saved, but ...; running workers ... pick it up ..."
            messages.warning(request, f"{text[:1].upper()}{text[1:]}.")

        return bump_failures_reported_to(warn)

    def save_model(self, request, obj, form, change) -> None:
        with self._warn_on_bump_failure(request):
            super().save_model(request, obj, form, change)

    def delete_model(self, request, obj) -> None:
        with self._warn_on_bump_failure(request):
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset) -> None:
        with self._warn_on_bump_failure(request):
            super().delete_queryset(request, queryset)
