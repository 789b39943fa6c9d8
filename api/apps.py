"""The API app's wiring: its beat task bound in ``ready()``, never by an import elsewhere."""

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    label = "api"
    verbose_name = "HTTP API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # inner import: the module imports models, which load after the AppConfig classes
        from api import maintenance  # noqa: F401  (the api.purge_audit shared task)
