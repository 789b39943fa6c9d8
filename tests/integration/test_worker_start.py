"""What a worker's start leaves its pool children: the start's objects frozen out of the collector.

Celery's prefork pool runs a full collection before each fork; with the start's objects frozen
(``lanes.worker.GcFreezeStep``) it skips them, and the children share those pages with the parent.
"""

from __future__ import annotations

import os

from tasks.dispatch import dispatch
from tests.support import gc_probe  # noqa: F401  (declares test.gc_probe here, as the worker does)
from tests.support.helpers import define, unique


def test_prefork_children_start_with_the_start_frozen(start_worker):
    lane, name = unique("gcf"), unique("gcf-probe")
    define(name, handler="test.gc_probe", lane=lane)
    worker = start_worker(lane, concurrency=1, env={"DISPATCH_HANDLER_MODULES": "tests.support.gc_probe"})
    reply = dispatch.delay(name, {}).get(timeout=60)
    assert reply["pid"] in worker.children() and reply["pid"] != os.getpid()
    # Django, Celery and the handlers: about 130,000 objects; none frozen without the step.
    assert reply["frozen"] > 50_000, reply
