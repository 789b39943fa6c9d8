"""Test session: a real redis-server on a free port and a fresh SQLite file, named before Django
loads settings, so tests and the worker processes they start share them.

Both are started (Redis) and migrated (SQLite) once the session's tests are collected, and only
when one of them is outside ``tests/unit``: the unit tier needs neither (``tests/unit/conftest.py``
makes a unit test that reaches for one fail, naming where it belongs), so ``make test-fast`` runs
without them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ARTIFACTS = ROOT / "test-artifacts"

_state: dict = {}


def pytest_configure(config):
    from tests.support.redis_server import RedisServer

    tmp = Path(tempfile.mkdtemp(prefix="dispatch-tests-"))
    _state["tmp"] = tmp
    server = RedisServer(tmp / "redis", secrets.token_urlsafe(12))
    server.port_chosen_here = False  # settings read its URL now: a start that finds the port taken retries it
    _state["redis"] = server
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "dispatchsite.settings",
        "REDIS_URL": server.url,
        # TEST_DATABASE_URL runs a session on another database (e.g. PostgreSQL, test_admin_properties_postgres).
        "DATABASE_URL": os.environ.get("TEST_DATABASE_URL") or f"sqlite:///{tmp / 'db.sqlite3'}",
        "DISPATCH_SECRETS_FILE": str(tmp / "secrets.json"),
        "DISPATCH_RUNTIME_FILE": str(tmp / "runtime.json"),  # never a `make run` going in this folder
        "DISPATCH_LEASE_S": os.environ.get("DISPATCH_LEASE_S", "6"),
        "DISPATCH_QUEUED_LEASE_S": os.environ.get("DISPATCH_QUEUED_LEASE_S", "120"),
        "CELERY_WORKER_SEND_TASK_EVENTS": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
    })
    import django

    django.setup()


UNIT = ROOT / "tests" / "unit"


def needs_services(test_files) -> bool:
    """Whether a session of these test files needs Redis and the database: any outside the unit tier."""
    return any(UNIT not in Path(path).resolve().parents for path in test_files)


def pytest_collection_finish(session):
    """Start Redis and migrate the database when a collected test is of a tier that uses them."""
    if not session.config.option.collectonly and needs_services(str(item.fspath) for item in session.items):
        start_services()


def start_services() -> None:
    if _state.get("started"):
        return
    _state["started"] = True
    _state["redis"].start()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def pytest_unconfigure(config):
    server = _state.get("redis")
    if server and _state.get("started"):
        server.stop()
    tmp = _state.get("tmp")
    if tmp and not os.environ.get("KEEP_TEST_TMP"):
        shutil.rmtree(tmp, ignore_errors=True)


#: Processes (with those below them) that outlive a module on purpose: the browser tier's one Chromium
#: (the session's Redis too, whose process a test that restarts it replaces).
OUTLIVE_MODULE: set[int] = set()


@pytest.fixture(scope="module", autouse=True)
def _module_leaves_nothing_running(request):
    """A module ends with no child process of its own still running, and no task left waiting in the
    session's Redis (tests/support/leftovers.py): what it started would otherwise run, or be expired by
    a later module's worker, inside that module's counts. A leaked process is killed and fails the module."""
    from tests.support.leftovers import descendants, leaked_children, settle_waiting

    before = set(descendants(os.getpid()))
    yield
    session_redis = _state["redis"].proc if _state.get("started") else None  # a test may have restarted it
    leaked = leaked_children(before, OUTLIVE_MODULE | ({session_redis.pid} if session_redis else set()))
    if _state.get("started") and _state["redis"].proc is not None and UNIT not in Path(request.path).resolve().parents:
        import redis

        try:
            settle_waiting(_state["redis"].client())
        except redis.RedisError as exc:  # a test that left the session's Redis down: nothing to settle
            print(f"leftover tasks not settled: {exc!r}")
    if leaked:
        pytest.fail(f"the module left child processes running (killed now): {leaked}", pytrace=False)


@pytest.fixture(scope="session")
def redis_server():
    return _state["redis"]


@pytest.fixture
def rc(redis_server):
    return redis_server.client()


@pytest.fixture(scope="session")
def tmp_root() -> Path:
    return _state["tmp"]


@pytest.fixture
def start_worker(tmp_root):
    """Start real Celery workers; all are stopped when the test ends."""
    from tests.support.workers import Worker, start_all

    started = []

    def start(queues: str, **kwargs):
        worker = Worker(queues, tmp_root / "logs", **kwargs).start()
        started.append(worker)
        return worker

    def many(count: int, queues: str, **kwargs):
        """``count`` workers alike, started at once."""
        workers = [Worker(queues, tmp_root / "logs", **kwargs) for _ in range(count)]
        started.extend(workers)
        return start_all(workers)

    start.many = many
    yield start
    # Done with when the test ends: killed, not stopped (a prefork worker's warm shutdown spends 2-3 s
    # in billiard's joins: about two minutes of the suite), then what a warm shutdown clears at once
    # is cleared here, its heartbeat and lane registrations. What it held is reclaimed like any dead
    # process's, on lanes no later test uses. Tests of shutdown itself stop their workers themselves.
    for worker in started:
        worker.discard()
    _clear_heartbeats(started)
    _keep_logs(started)


def _keep_logs(workers) -> None:
    for worker in workers:
        log = worker.log_path
        if log.exists():
            ARTIFACTS.mkdir(exist_ok=True)
            shutil.copy(log, ARTIFACTS / log.name)


def _clear_heartbeats(workers) -> None:
    import socket

    from lanes.consumers import clear_heartbeat
    from lanes.redis_client import get_redis

    for worker in workers:
        try:
            clear_heartbeat(get_redis(), f"{worker.name}@{worker.host or socket.gethostname()}",
                            worker.queues.split(","))
        except Exception:  # noqa: BLE001 - a test that stopped Redis: the beat expires by itself
            pass


@pytest.fixture(scope="module")
def module_workers(tmp_root):
    """``start_worker`` for a whole module: each worker started once for the module's tests (about 1.3 s a
    start, and a new worker's first task is slower still), each test on its own lanes. Killed at the
    module's end, like ``start_worker``'s: what they still held is on lanes no later test uses."""
    from tests.support.workers import Worker

    started = []

    def start(queues: str, **kwargs):
        worker = Worker(queues, tmp_root / "logs", **kwargs).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.discard()
    _clear_heartbeats(started)
    _keep_logs(started)


@pytest.fixture(scope="module")
def shared_worker(request, module_workers):
    """One worker serving every lane of the module's ``SHARED_LANES`` (a dict of unique names made at
    import, one a test), with the module's ``SHARED_WORKER`` options. A test that kills, stops or
    reconfigures a worker, or needs its tasks to wait for a worker's start, starts its own."""
    return module_workers(",".join(request.module.SHARED_LANES.values()),
                          **getattr(request.module, "SHARED_WORKER", {}))


@pytest.fixture
def sink():
    from tests.support.http_sink import SinkServer

    with SinkServer() as server:
        yield server


TEST_LANES = "t-default,t-realtime,t-http,t-other"


@pytest.fixture(scope="module")
def lane_worker(tmp_root):
    """One prefork worker serving the common test lanes for a whole module."""
    from tests.support.workers import Worker

    worker = Worker(TEST_LANES, tmp_root / "logs", concurrency=2).start()
    yield worker
    worker.retire()  # the next module uses the common lanes too: nothing left running on them
    _clear_heartbeats([worker])


@pytest.fixture
def admin_client():
    from django.contrib.auth import get_user_model
    from django.test import Client

    User = get_user_model()
    user = User.objects.filter(username="root").first() or User.objects.create_superuser("root", "r@x", "pw-root-123")
    client = Client()
    client.force_login(user)
    return client
