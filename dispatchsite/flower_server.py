"""Flower as ``make run`` starts it: its own ``/metrics`` and ``/healthcheck`` behind the auth of its pages.

Flower 2 serves those two without any check (its other pages carry
``tornado.web.authenticated``): task type and worker names, counts and
runtimes to anyone on the port. ``python -m dispatchsite.flower_server ARGS``
gives them the same decorator, then runs ``celery -A dispatchsite flower ARGS``:
with ``FLOWER_BASIC_AUTH`` set they answer 401 without its credentials.
"""

from __future__ import annotations

import sys

#: Marks a handler method already wrapped (a second call wraps nothing).
_GUARDED = "_dispatch_auth_required"


def guard_open_handlers() -> list[str]:
    """Put Flower's open handlers behind its auth; returns the names of those it wrapped."""
    from flower.views import monitor
    from tornado import web

    wrapped = []
    for handler in (monitor.Metrics, monitor.Healthcheck):
        if getattr(handler.get, _GUARDED, False):
            continue
        guarded = web.authenticated(handler.get)
        setattr(guarded, _GUARDED, True)
        handler.get = guarded  # type: ignore[method-assign]
        wrapped.append(handler.__name__)
    return wrapped


def main(argv: list[str]) -> None:
    guard_open_handlers()
    from celery.bin.celery import main as celery_main

    sys.argv = ["celery", "-A", "dispatchsite", "flower", *argv]
    celery_main()


if __name__ == "__main__":
    main(sys.argv[1:])
