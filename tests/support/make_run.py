"""The real ``make run`` (``scripts/run.py``) from a copy of the project, for tests that check what it does.

Used by the README test and the private-files test: copy the project's files
to a temporary folder, start ``scripts/run.py`` there on free ports in its own
process group, wait until it is up, and stop it as Ctrl-C does (SIGINT to the
group), then by PID: nothing it started outlives the test.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.workers import ROOT

#: What a copy leaves out: history, the environment, and anything a run or a tool wrote.
SKIPPED = (".git", ".venv", ".venv-bare", "var", "test-artifacts", "staticfiles", "__pycache__", ".pytest_cache",
           ".ruff_cache", ".mypy_cache", ".dispatch-secrets.json", ".hypothesis")
#: Variables the test session sets for itself, which a ``make run`` of its own must not inherit.
SESSION_ONLY = {"REDIS_URL", "DATABASE_URL", "DISPATCH_SECRETS_FILE", "DISPATCH_RUNTIME_FILE", "DJANGO_SETTINGS_MODULE"}


def copy_project(dest: Path, *, venv: bool = False) -> Path:
    """The project's files in ``dest``; with ``venv``, ``.venv`` links to the running interpreter's."""
    shutil.copytree(ROOT, dest, symlinks=True, ignore=shutil.ignore_patterns(*SKIPPED))
    if venv:
        (dest / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return dest


def plain_env(drop: set[str] = frozenset()) -> dict[str, str]:
    """This process's environment without the test session's own settings (and ``drop``)."""
    return {k: v for k, v in os.environ.items() if k not in SESSION_ONLY | set(drop)}


def http_status(url: str, auth: tuple[str, str] | None = None) -> int | None:
    """The HTTP status of a GET (``None`` when nothing answers)."""
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


class Started:
    """A running ``scripts/run.py``: its process, its log, and every process seen below it."""

    def __init__(self, proc: subprocess.Popen, log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.seen: set[int] = set()

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def look(self) -> None:
        self.seen.update(descendants(self.proc.pid))


@contextmanager
def make_run(root: Path, env: dict[str, str], up: Callable[[], bool], *, timeout_s: float,
             umask: int | None = None) -> Iterator[Started]:
    """Start ``scripts/run.py`` in ``root``; yield once the banner is printed and ``up()`` holds.

    Raises ``TimeoutError`` (with the log's tail) when it is not up within
    ``timeout_s``, ``RuntimeError`` when it exits first.
    """
    log_path = root / "run.log"
    old_umask = os.umask(umask) if umask is not None else None
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=root, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    run = Started(proc, log_path)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"make run exited with {proc.returncode}: {run.log_tail()}")
            run.look()
            if b"Ctrl-C stops everything" in log_path.read_bytes() and up():
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"make run not up within {timeout_s}s: {run.log_tail()}")
            time.sleep(0.1)  # a start is seconds: polled at 0.5 s, a quarter second of each was waiting to look
        run.look()
        yield run
    finally:
        run.look()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: honcho stops its processes, then Redis stops
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid in run.seen - {proc.pid}:  # anything this run started that is still running (same cwd)
            try:
                if os.readlink(f"/proc/{pid}/cwd").startswith(str(root)):
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
