"""The one Celery app of the platform, and the one place worker steps are wired.

Configuration comes from Django settings. The apps reach this app through
``celery.current_app`` / ``shared_task``, never by importing this module; their
tasks, handlers and signal receivers are bound in their ``ready()``
(``TasksConfig``: the handler registry, ``tasks.receivers.connect()``).

Worker bootsteps are named by path: Celery resolves them when a worker starts,
after Django's apps are ready, so nothing here imports an app.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchsite.settings")
#: Celery's Django fixup runs every system check when a worker starts, and drops what they find: all
#: they do there is import the URLconf for the URL checks (the HTTP API, django-ninja, pydantic, the
#: operator pages), which a worker never serves. ``manage.py check``/``migrate`` run the checks;
#: ``CELERY_SKIP_CHECKS=`` (empty) brings them back in a worker.
os.environ.setdefault("CELERY_SKIP_CHECKS", "true")

#: Task events are gathered and folded per task before they are published (tasks.worker_events).
app = Celery("dispatchsite", events="tasks.worker_events:Events")
app.config_from_object("django.conf:settings", namespace="CELERY")

#: Threads and checks every worker runs (see each class's docstring).
WORKER_STEPS = (
    "lanes.worker:LeaseBookStep",  # the process's lease book: its messages from pop to settle
    "tasks.maintenance:MaintenanceStep",  # promote retries, expire, sweep leases, audit chats
    "lanes.worker:StackDumpStep",  # kill -USR2 dumps every thread's stack
    "lanes.worker:PausedLanesStep",  # a paused lane is not consumed at start
    "lanes.worker:HeartbeatStep",  # heartbeats; the catch-all worker adopts unheld lanes
    "ops.worker_steps:MetricsSamplerStep",  # depth/throughput samples for the dashboard charts (ops)
    "lanes.worker:GcFreezeStep",  # the start's objects out of the collector before the pool forks
)
app.steps["worker"].update(WORKER_STEPS)
