"""The tasks app's wiring: handlers bound, receivers connected, hook modules loaded, in ``ready()``."""

from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.conf import settings


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = "Tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # inner import: these modules import models, which load after the AppConfig classes
        from celery import current_app

        from tasks import bulk, dispatch, handlers, maintenance, receivers, registry  # noqa: F401  (bulk, dispatch, maintenance: shared tasks)
        from tasks.batching import BatchHandlerTask
        from tasks.execution import HandlerTask

        registry.bind(current_app._get_current_object(), HandlerTask, BatchHandlerTask)
        receivers.connect()
        # Modules whose receivers must be connected in every process, workers
        # included (worker-side signals fire in the worker): DISPATCH_HOOK_MODULES.
        for module in getattr(settings, "DISPATCH_HOOK_MODULES", ()):
            importlib.import_module(module)
