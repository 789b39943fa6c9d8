"""What the platform's ``manage.py`` commands share."""

from __future__ import annotations

from django.core.checks import Tags

#: The system checks a command runs before it acts (its ``requires_system_checks``): the models', what a
#: command reads and writes. Django's default, every check, imports the URLconf for its URL checks (the
#: HTTP API with django-ninja and pydantic, the operator pages: 0.25 s of CPU a run), though no command
#: serves a URL. ``manage.py check``, ``migrate`` and ``runserver`` still run them all.
CHECKS = [Tags.models]
