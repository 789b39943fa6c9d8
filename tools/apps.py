"""The measuring tools app: installed by default, left out of the production profile (``DISPATCH_TOOLS``)."""

from __future__ import annotations

from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"
    label = "tools"
    verbose_name = "Measuring tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the loadtest.sink handler and the SMS demo's, only where tools are installed.
        from tools import sink, sms_demo  # noqa: F401
