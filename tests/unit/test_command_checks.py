"""Every ``manage.py`` command of the platform's apps runs the models' checks only (``tasks.commands.CHECKS``):
Django's default, every check, imports the URLconf (the HTTP API, django-ninja, pydantic) in each run."""

from __future__ import annotations

from django.core.management import get_commands, load_command_class

from tasks import commands

OURS = ("api", "ops", "tasks", "tools")


def test_every_command_of_ours_runs_the_models_checks_only():
    ours = {name: app for name, app in get_commands().items() if app in OURS}
    assert len(ours) >= 10, ours
    wrong = {name: load_command_class(app, name).requires_system_checks for name, app in ours.items()
             if load_command_class(app, name).requires_system_checks != commands.CHECKS}
    assert not wrong, f"set requires_system_checks = tasks.commands.CHECKS in: {wrong}"
