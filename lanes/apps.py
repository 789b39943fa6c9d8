import importlib

from django.apps import AppConfig


class LanesConfig(AppConfig):
    name = "lanes"
    verbose_name = "Lanes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from lanes import receivers, signals  # noqa: F401  (config version bumps, rejection counts)

        # Modules whose receivers must be connected in every process, workers
        # included (worker-side signals fire in the worker): DISPATCH_HOOK_MODULES.
        for module in getattr(settings, "DISPATCH_HOOK_MODULES", ()):
            importlib.import_module(module)
