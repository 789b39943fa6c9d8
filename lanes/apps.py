"""The lanes app's wiring: a save or delete of a ``Lane`` bumps the config version."""

from __future__ import annotations

from django.apps import AppConfig


class LanesConfig(AppConfig):
    name = "lanes"
    verbose_name = "Lanes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # inner import: these modules import models, which load after the AppConfig classes
        from lanes import config_version
        from lanes.models import Lane

        config_version.connect(Lane)
