"""What a worker's start leaves its pool children: only what a worker uses imported, and the start's
objects frozen out of the collector.

- Celery's Django fixup runs the system checks at a worker's start, whose URL checks import the
  URLconf (the HTTP API, the operator pages): skipped (``dispatchsite.celery``), a worker serves no URL.
- Celery's prefork pool runs a full collection before each fork; with the start's objects frozen
  (``lanes.worker.GcFreezeStep``) it skips them, and the children share those pages with the parent.
"""

from __future__ import annotations

import os

import pytest

from tasks.dispatch import dispatch
from tests.support import worker_probe  # noqa: F401  (declares test.worker_probe here, as the worker does)
from tests.support.helpers import define, unique

#: The web side's modules: the URLconf and what only it imports (django-ninja and pydantic with the API).
WEB_MODULES = ["dispatchsite.urls", "api.views", "api.schemas", "ops.views", "ninja", "pydantic"]


@pytest.fixture(scope="module")
def probe(module_workers):
    """The reply of ``test.worker_probe`` run by a prefork child of a fresh worker, and that worker."""
    lane, name = unique("probe"), unique("probe-type")
    define(name, handler="test.worker_probe", lane=lane)
    worker = module_workers(lane, concurrency=1, env={"DISPATCH_HANDLER_MODULES": "tests.support.worker_probe"})
    return dispatch.delay(name, {"modules": WEB_MODULES}).get(timeout=60), worker


def test_the_reply_comes_from_a_pool_child(probe):
    reply, worker = probe
    assert reply["pid"] in worker.children() and reply["pid"] != os.getpid()


def test_a_worker_does_not_import_the_web_side(probe):
    reply, _ = probe
    assert reply["imported"] == []


def test_prefork_children_start_with_the_start_frozen(probe):
    reply, _ = probe
    # Django, Celery and the handlers: about 130,000 objects; none frozen without the step.
    assert reply["frozen"] > 50_000, reply
