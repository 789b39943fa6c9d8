"""The one Celery app of the platform; configuration comes from Django settings."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchsite.settings")

app = Celery("dispatchsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.imports = ("tasks.dispatch", "tasks.handlers", "tasks.maintenance", "lanes.worker")

# Worker steps of the apps above tasks (they register nothing when imported).
from ops.worker_steps import MetricsSamplerStep  # noqa: E402  (wired here: the dashboard charts' sampler)

app.steps["worker"].add(MetricsSamplerStep)
