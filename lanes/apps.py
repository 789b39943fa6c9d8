from django.apps import AppConfig


class LanesConfig(AppConfig):
    name = "lanes"
    verbose_name = "Lanes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from lanes import signals  # noqa: F401  (config version bumps)
