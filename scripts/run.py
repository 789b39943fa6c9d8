"""``make run``: the whole platform in the foreground until Ctrl-C.

Starts the embedded Redis (unless ``REDIS_URL`` names another), prepares the
database and the default configuration, then hands web, workers, beat and
Flower to honcho. Ctrl-C stops them all, then Redis.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
PY = sys.executable


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


#: The platform's Redis user: every command but the ``@admin`` and ``@dangerous`` ones (no ``CONFIG``,
#: ``DEBUG``, ``MODULE``, ``FLUSHALL``, ``KEYS``, ``CLIENT``, ...), ``INFO`` given back (the status
#: page reads the replication section). Every key and channel: Celery and kombu name their own.
PLATFORM_ACL = "~* &* +@all -@admin -@dangerous +info"


def redis_conf(port: int, password: str, data_dir: Path, admin_password: str) -> str:
    """The embedded Redis's config: ``password`` for the platform's ACL user, ``admin_password`` for ``default``.

    ``maxmemory`` (``REDIS_MAXMEMORY``, 1gb) with ``noeviction``: a flood ends in
    admission answering ``redis_memory_high`` past ``DISPATCH_MEMORY_HIGH`` of it
    (lanes/memory_guard.py; ``unavailable``, "Redis is out of memory", at the limit
    itself), never in the host's memory running out, and no key (a task's record)
    is ever evicted.
    """
    from lanes.capacity import REDIS_CONFIG  # inner import: the project's path is set by main()

    fsync = os.environ.get("REDIS_APPENDFSYNC", "always")
    maxmemory = os.environ.get("REDIS_MAXMEMORY", "1gb")
    return "\n".join([
        f"port {port}", "bind 127.0.0.1", "protected-mode yes", f'requirepass "{admin_password}"',
        f"user dispatch on >{password} {PLATFORM_ACL}",
        f"maxmemory {maxmemory}", "maxmemory-policy noeviction",
        f"dir {data_dir}", "appendonly yes", f"appendfsync {fsync}", 'save ""',
        "daemonize no", "loglevel notice", "maxclients 2000",
        *(f"{name} {value}" for name, value in REDIS_CONFIG.items()), "",
    ])


def private_var(var: Path) -> None:
    """``var/`` (database, Redis data, logs) readable by its owner only, also one made by an older version.

    New files are private by the process umask (``main`` sets 0077); this takes
    group and other bits off what an earlier run left behind.
    """
    var.mkdir(mode=0o700, exist_ok=True)
    for dirpath, _dirnames, filenames in os.walk(var):
        os.chmod(dirpath, 0o700)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode & 0o700)


def write_private(path: Path, text: str) -> None:
    """Write ``path`` as mode 0600 from its first byte (never readable by others, even for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_TRUNC
        fh.write(text)


def start_redis(port: int, password: str, admin_password: str, var: Path = VAR) -> subprocess.Popen:
    """Start the embedded Redis; its passwords are only in the 0600 config file, never on a command line."""
    from dispatchsite.redis_server import server_path

    data_dir = var / "redis"
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    conf = data_dir / "redis.conf"
    write_private(conf, redis_conf(port, password, data_dir, admin_password))
    log = os.open(data_dir / "redis.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # Its own session: the terminal's Ctrl-C (SIGINT to the foreground group) must not stop Redis
        # before the workers; run.py stops it last (main's finally).
        proc = subprocess.Popen([server_path(), str(conf)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        os.close(log)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, username="dispatch", password=password, socket_timeout=1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"redis-server exited at start (see {data_dir / 'redis.log'})")
        try:
            client.ping()
            return proc
        except redis.RedisError:
            time.sleep(0.1)
    proc.terminate()
    sys.exit("redis-server did not answer within 30 s")


def secrets_file() -> Path:
    return Path(os.environ.get("DISPATCH_SECRETS_FILE", ROOT / ".dispatch-secrets.json"))


def main() -> int:
    # Before anything is created: files this run and its children make (database,
    # Redis data, logs, beat schedule) are private to the user running it.
    os.umask(0o077)
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchsite.settings")
    from dispatchsite.runtime import remove_runtime, runtime_path, write_runtime
    from dispatchsite.secrets import load_secrets

    secrets = load_secrets(secrets_file())
    web_port = int(os.environ.get("WEB_PORT", "8000"))
    flower_port = int(os.environ.get("FLOWER_PORT", "5555"))
    redis_port = int(os.environ.get("REDIS_PORT", "6380"))
    embedded = not os.environ.get("REDIS_URL")
    ports = {"WEB_PORT": web_port, "FLOWER_PORT": flower_port}
    if embedded:
        ports["REDIS_PORT"] = redis_port
    for name, port in ports.items():
        if not port_free(port):
            print(f"error: port {port} ({name}) is already in use on 127.0.0.1; "
                  f"stop what uses it or set {name}=<another port>", file=sys.stderr)
            return 2

    private_var(VAR)
    redis_proc = start_redis(redis_port, secrets["redis_password"], secrets["redis_admin_password"]) \
        if embedded else None
    # Every process started from here, and every command run in the project folder
    # while this runs (dispatchsite.runtime), uses these ports.
    os.environ.update({name: str(port) for name, port in (("WEB_PORT", web_port), ("FLOWER_PORT", flower_port),
                                                          ("REDIS_PORT", redis_port))})
    runtime_file = runtime_path(ROOT)
    write_runtime(runtime_file, {
        "WEB_PORT": web_port, "FLOWER_PORT": flower_port, "REDIS_PORT": redis_port if embedded else None,
        "REDIS_URL": os.environ.get("REDIS_URL"), "ADMIN_URL": f"http://127.0.0.1:{web_port}/admin/",
        "FLOWER_URL": f"http://127.0.0.1:{flower_port}/",
        "DISPATCH_HANDLER_MODULES": os.environ.get("DISPATCH_HANDLER_MODULES"),
    })
    try:
        subprocess.run([PY, "manage.py", "bootstrap"], check=True)
        return run_services(secrets, web_port, flower_port)
    except subprocess.CalledProcessError as exc:
        print(f"error: {shlex.join(exc.cmd)} failed with exit code {exc.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the services started: nothing to stop but Redis
        print("interrupted before the services started", file=sys.stderr)
        return 0
    finally:
        remove_runtime(runtime_file)
        if redis_proc is not None:
            redis_proc.terminate()
            try:
                redis_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                redis_proc.kill()


def worker_groups(environ: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Each worker group's queues, pool, concurrency and instances: ``tasks.worker_groups`` (defined once there,
    where ``manage.py smsload`` reads the same shape), with the ``WORKER_*`` overrides of ``environ``."""
    from tasks.worker_groups import worker_groups as groups  # inner import: the project's path is set by main()

    return groups(environ)


def banner(secrets_file: Path, web_port: int, flower_port: int) -> str:
    """What ``make run`` prints once everything is started (the README shows the same lines).

    Where the credentials are, never the credentials: the output of ``make run``
    ends up in terminals' scrollback and in log collectors.
    """
    return (
        "\n"
        f"  Admin:     http://127.0.0.1:{web_port}/admin/   user admin, password: admin_password\n"
        f"  Dashboard: http://127.0.0.1:{web_port}/admin/dashboard/\n"
        f"  Flower:    http://127.0.0.1:{flower_port}/   user admin, password: flower_password\n"
        f"  Metrics:   http://127.0.0.1:{web_port}/metrics   Authorization: Bearer <metrics_token>\n"
        f"  (the credentials are in {_shown_path(secrets_file)}, mode 0600)\n"
        "  Ctrl-C stops everything.\n"
    )


#: The order a stop (Ctrl-C, or one process exiting) takes, by process name prefix: what
#: calls the workers and Redis first, then the workers (a warm shutdown, finishing what
#: they run), then, in ``main``, Redis. Stopping all at once let Redis go first and
#: filled the log with the workers' connection tracebacks.
STOP_ORDER: tuple[tuple[str, ...], ...] = (("web", "beat", "flower"), ("worker-",))
#: Seconds each stage may take before what is left of it is killed.
STOP_STAGE_WAIT_S = 20.0


def ordered_manager() -> Any:
    """A honcho ``Manager`` that stops its processes stage by stage (:data:`STOP_ORDER`), each wait bounded."""
    import threading

    from honcho.manager import Manager

    class OrderedManager(Manager):
        _stopper: threading.Thread | None = None

        def _killall(self, force: bool = False) -> None:
            if not force:
                if self._stopper is None:
                    self._stopper = threading.Thread(target=self._stop_in_order, name="ordered-stop", daemon=True)
                    self._stopper.start()
                return
            if self._stopper is not None and self._stopper.is_alive():
                return  # honcho kills 5 s after the first exit; the staged stop has its own bound
            super()._killall(force=True)

        def _running(self, names: list[str]) -> list[str]:
            return [n for n in names if "returncode" not in self._processes[n] and self._processes[n].get("pid")]

        def _signal(self, names: list[str], force: bool) -> None:
            for name in self._running(names):
                pid = self._processes[name]["pid"]
                self._system_print(f"sending {'SIGKILL' if force else 'SIGTERM'} to {name} (pid {pid})\n")
                (self._procmgr.kill if force else self._procmgr.terminate)(pid)

        def _stop_in_order(self) -> None:
            names = list(self._processes)
            stages = [[n for n in names if n.startswith(prefixes)] for prefixes in STOP_ORDER]
            stages.append([n for n in names if not any(n in stage for stage in stages)])
            for stage in stages:
                self._signal(stage, force=False)
                deadline = time.monotonic() + STOP_STAGE_WAIT_S
                while self._running(stage) and time.monotonic() < deadline:
                    time.sleep(0.1)
                self._signal(stage, force=True)

    return OrderedManager()


def _shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def run_services(secrets: dict, web_port: int, flower_port: int) -> int:
    from honcho.manager import SIGNALS

    bindir = Path(PY).parent
    celery = str(bindir / "celery")
    # Two log lines per task at INFO cost worker (and honcho) CPU at hundreds of tasks/s:
    # WORKER_LOGLEVEL=INFO shows them. Task events stay on so Flower shows tasks;
    # WORKER_EVENTS=0 also stops Flower from switching them on (it then shows workers only).
    loglevel = os.environ.get("WORKER_LOGLEVEL", "WARNING")
    events = os.environ.get("WORKER_EVENTS", "1") not in {"0", "false", "no", "off"}
    os.environ["CELERY_WORKER_SEND_TASK_EVENTS"] = "1" if events else "0"  # the setting, not only -E
    manager = ordered_manager()
    manager.add_process("web", f"{bindir / 'gunicorn'} dispatchsite.wsgi -b 127.0.0.1:{web_port} "
                               f"-w 2 --threads 4 --access-logfile -")
    for name, group in worker_groups().items():
        for n in range(1, group["instances"] + 1):
            label = name if group["instances"] == 1 else f"{name}{n}"
            # dispatchsite.worker: `celery -A dispatchsite worker` without the rest of Celery's command line
            manager.add_process(f"worker-{label}", f"{PY} -m dispatchsite.worker -Q {group['queues']} "
                                                   f"-n {label}@%h -P {group['pool']} -c {group['concurrency']} "
                                                   f"{'-E ' if events else ''}--without-gossip --without-mingle "
                                                   f"-l {loglevel}",
                                env={**os.environ, "DISPATCH_CATCH_ALL": "1"} if group["catch_all"] else None)
    VAR.mkdir(exist_ok=True)
    # Beat's scheduler is the settings' CELERY_BEAT_SCHEDULER (tasks.beat: the database's schedules, the admin's).
    manager.add_process("beat", f"{celery} -A dispatchsite beat -l INFO")
    # Flower reads its credentials from FLOWER_BASIC_AUTH (user:password[,...]): a
    # command line is readable by every local user (ps, /proc/<pid>/cmdline).
    # dispatchsite.flower_server: `celery flower` with its /metrics and /healthcheck behind the same auth.
    manager.add_process("flower", f"{PY} -m dispatchsite.flower_server --address=127.0.0.1 --port={flower_port} "
                                  f"--purge_offline_workers=60{'' if events else ' --enable_events=False'}",
                        env={**os.environ, "FLOWER_BASIC_AUTH": f"admin:{secrets['flower_password']}"})
    print(banner(secrets_file(), web_port, flower_port), flush=True)
    manager.loop()
    if manager.returncode in (SIGNALS[signal.SIGINT]["rc"], SIGNALS[signal.SIGTERM]["rc"]):
        return 0  # Ctrl-C (or a plain kill) asked for this stop: a clean end, not make's "Error 130"
    return manager.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
