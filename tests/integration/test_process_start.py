"""What a process imports at its start: only what it uses. And what a worker's start leaves its pool
children: the start's objects frozen out of the collector.

- django-ninja is no installed app (``settings.NINJA_DIR``): only the web's URLconf imports it.
- Celery's Django fixup runs the system checks at a worker's start, whose URL checks import the
  URLconf (the HTTP API, the operator pages): skipped (``dispatchsite.celery``), a worker serves no URL.
- A worker starts through ``python -m dispatchsite.worker``: Celery's ``worker`` command without the
  rest of its command line (every subcommand, Flower's plugin); ``celery -A dispatchsite worker`` still
  starts the same worker.
- The platform's ``manage.py`` commands run the models' checks only (``tasks.commands.CHECKS``), not
  the URL checks.
- Celery's prefork pool runs a full collection before each fork; with the start's objects frozen
  (``lanes.worker.GcFreezeStep``) it skips them, and the children share those pages with the parent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.dispatch import dispatch
from tests.support import worker_probe  # noqa: F401  (declares test.worker_probe here, as the worker does)
from tests.support.helpers import define, unique
from tests.support.workers import CELERY

ROOT = Path(__file__).resolve().parents[2]
#: The web side's modules: the URLconf and what only it imports (django-ninja and pydantic with the API).
WEB_MODULES = ["dispatchsite.urls", "api.views", "api.schemas", "ops.views", "ninja", "pydantic"]


#: What only Celery's whole command line imports: Flower's plugin, the amqp shell's prompt.
CLI_MODULES = ["celery.bin.celery", "celery.bin.amqp", "flower", "click_repl", "prompt_toolkit"]


@pytest.fixture(scope="module")
def probe(module_workers):
    """The reply of ``test.worker_probe`` run by a prefork child of a fresh worker, and that worker."""
    lane, name = unique("probe"), unique("probe-type")
    define(name, handler="test.worker_probe", lane=lane)
    worker = module_workers(lane, concurrency=1, env={"DISPATCH_HANDLER_MODULES": "tests.support.worker_probe"})
    return dispatch.delay(name, {"modules": WEB_MODULES + CLI_MODULES}).get(timeout=60), worker


def test_the_reply_comes_from_a_pool_child(probe):
    reply, worker = probe
    assert reply["pid"] in worker.children() and reply["pid"] != os.getpid()


def test_a_worker_does_not_import_the_web_side(probe):
    reply, _ = probe
    assert reply["imported"] == []


def test_a_worker_does_not_import_the_rest_of_celerys_command_line(probe):
    reply, _ = probe
    assert sorted(set(reply["imported"]) & set(CLI_MODULES)) == []


def test_celerys_own_command_starts_the_same_worker(start_worker):
    lane, name = unique("probe-cli"), unique("probe-cli-type")
    define(name, handler="test.worker_probe", lane=lane)
    worker = start_worker(lane, concurrency=1, command=[CELERY, "-A", "dispatchsite", "worker"],
                          env={"DISPATCH_HANDLER_MODULES": "tests.support.worker_probe"})
    reply = dispatch.delay(name, {"modules": CLI_MODULES}).get(timeout=60)
    assert reply["pid"] in worker.children() and reply["frozen"] > 50_000
    assert "celery.bin.celery" in reply["imported"]  # the whole command line, as before


def test_prefork_children_start_with_the_start_frozen(probe):
    reply, _ = probe
    # Django, Celery and the handlers: about 130,000 objects; none frozen without the step.
    assert reply["frozen"] > 50_000, reply


def _imported(stderr: str) -> set[str]:
    """The modules ``python -X importtime`` reported (``import time: self | cumulative | name``)."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


COMMANDS = {"dispatch": ["dispatch", "no-such-type-ps", "--payload", "{}"],
            "capacity": ["capacity", "--rate", "10", "--backlog", "1000"]}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_command_does_not_import_the_web_side(command):
    done = subprocess.run([sys.executable, "-X", "importtime", "manage.py", *command], cwd=ROOT, env=os.environ.copy(),
                          capture_output=True, text=True, timeout=120)
    imported = _imported(done.stderr)
    assert done.returncode in (0, 1) and "tasks.registry" in imported, done.stderr[-2000:]  # it ran to its end
    assert sorted(imported & set(WEB_MODULES)) == []
