"""The measuring tools app: installed by default, left out of the production profile (``DISPATCH_TOOLS``)."""

from __future__ import annotations

from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"
    label = "tools"
    verbose_name = "Measuring tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tools import sink  # noqa: F401  (registers the loadtest.sink handler, only where tools are installed)
