"""The operator's pages app: what people use to watch and steer the platform (above ``tasks``)."""

from __future__ import annotations

from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "ops"
    label = "ops"
    verbose_name = "Operations"
    default_auto_field = "django.db.models.BigAutoField"
