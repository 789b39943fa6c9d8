"""The tasks app's wiring: handlers bound, receivers connected, hook modules loaded, in ``ready()``."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = "Tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # inner import: these modules import models, which load after the AppConfig classes
        from celery import current_app

        from tasks import beat, bulk, dispatch, handlers, maintenance, receivers, registry, tracing  # noqa: F401  (beat, bulk, dispatch, maintenance: shared tasks)
        from tasks.batching import BatchHandlerTask
        from tasks.execution import HandlerTask

        registry.bind(current_app._get_current_object(), HandlerTask, BatchHandlerTask)
        receivers.connect()
        # The users' handlers (DISPATCH_HANDLER_MODULES), declared in every process so the
        # admin offers them and workers run them; then the modules whose receivers must be
        # connected where the signals fire, workers included (DISPATCH_HOOK_MODULES).
        import_modules("DISPATCH_HANDLER_MODULES", getattr(settings, "DISPATCH_HANDLER_MODULES", ()))
        for module in getattr(settings, "DISPATCH_HOOK_MODULES", ()):
            importlib.import_module(module)
        # OpenTelemetry from the OTEL_* variables (after the hook modules: a tracer provider one sets is used)
        tracing.configure()


def import_modules(setting: str, modules: Iterable[str]) -> None:
    """Import each module a setting names; one that fails stops the process with a message naming it."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ImproperlyConfigured(f"{setting}: cannot import {module!r}: {type(exc).__name__}: {exc} "
                                       f"(a module path importable from the project folder or PYTHONPATH, "
                                       f"e.g. myhandlers for ./myhandlers.py)") from exc
