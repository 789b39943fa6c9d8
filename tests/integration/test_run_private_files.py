"""Issue 12: what ``make run`` leaves on disk and on command lines is private to its user.

Runs the real ``scripts/run.py`` (embedded Redis, migrations on SQLite, web, one
worker, beat, Flower) from a copy of the project in a temporary folder whose
``var/`` an older version left world-readable, on free ports, under umask 022;
then checks the modes of ``var/`` and everything in it, that no process's
command line holds the Flower or Redis password, and that Flower still asks
for the credentials it now reads from its environment. Stopped by Ctrl-C
(SIGINT to its process group), then by PID.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.redis_server import free_port
from tests.support.workers import ROOT

START_TIMEOUT_S = 180


def _status(url: str, auth: tuple[str, str] | None = None) -> int | None:
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


def _descendants(root: int) -> list[int]:
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


def _cmdlines() -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
    return out


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def clone(tmp_path) -> Path:
    """The project's files (not .git, .venv, var) in a temporary folder, with an old world-readable var/."""
    root = tmp_path / "project"
    shutil.copytree(ROOT, root, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "var", "test-artifacts", "staticfiles", "__pycache__", ".pytest_cache", ".ruff_cache",
        ".dispatch-secrets.json", ".hypothesis"))
    (root / "var" / "redis").mkdir(parents=True)
    (root / "var").chmod(0o755)
    (root / "var" / "redis").chmod(0o755)
    old = root / "var" / "redis" / "redis.conf"
    old.write_text("# from an older run\n")
    old.chmod(0o644)
    return root


def test_make_run_keeps_var_private_and_secrets_off_command_lines(clone):
    web, flower, redis_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in {"REDIS_URL", "DATABASE_URL", "DISPATCH_SECRETS_FILE", "DISPATCH_RUNTIME_FILE",
                         "DJANGO_SETTINGS_MODULE"}}
    env.update({"WEB_PORT": str(web), "FLOWER_PORT": str(flower), "REDIS_PORT": str(redis_port),
                "WORKER_GROUPS": json.dumps({"d": "default,ingress"}), "WORKER_POOL": "solo",
                "WORKER_CONCURRENCY": "1", "WORKER_LOGLEVEL": "WARNING", "REDIS_APPENDFSYNC": "everysec"})
    log_path = clone / "run.log"
    old_umask = os.umask(0o022)  # what a login shell usually has: run.py must not rely on it
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=clone, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        os.umask(old_umask)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            seen.update(_descendants(proc.pid))
            if (b"Ctrl-C stops everything" in log_path.read_bytes()
                    and _status(f"http://127.0.0.1:{flower}/") is not None
                    and _status(f"http://127.0.0.1:{web}/admin/login/") == 200):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"make run not up within {START_TIMEOUT_S}s: {log_path.read_text(errors='replace')[-3000:]}")
        seen.update(_descendants(proc.pid))
        secrets = json.loads((clone / ".dispatch-secrets.json").read_text())

        # Flower asks for the credentials it read from FLOWER_BASIC_AUTH.
        assert _status(f"http://127.0.0.1:{flower}/") == 401
        assert _status(f"http://127.0.0.1:{flower}/", ("admin", secrets["flower_password"])) == 200

        # No command line on the machine holds a password.
        for pid, cmdline in _cmdlines().items():
            for name in ("flower_password", "redis_password", "admin_password", "metrics_token", "secret_key"):
                assert secrets[name] not in cmdline, (pid, name, cmdline[:200])
        ours = _cmdlines()
        assert any("flower" in ours.get(pid, "") for pid in seen)
        assert not any("basic-auth" in ours.get(pid, "") or "requirepass" in ours.get(pid, "") for pid in seen)

        # var/ and everything in it: the owner's only.
        var = clone / "var"
        assert _mode(var) == 0o700 and _mode(var / "redis") == 0o700
        assert _mode(var / "redis" / "redis.conf") == 0o600
        assert secrets["redis_password"] in (var / "redis" / "redis.conf").read_text()
        assert (var / "dispatch.sqlite3").exists() and _mode(var / "dispatch.sqlite3") == 0o600
        assert list((var / "redis").glob("appendonly*")), sorted(p.name for p in (var / "redis").iterdir())
        loose = []
        for path in [var, *var.rglob("*")]:
            if not path.is_symlink() and _mode(path) & 0o077:
                loose.append(f"{path.relative_to(clone)} {oct(_mode(path))}")
        assert loose == []
        assert _mode(clone / ".dispatch-secrets.json") == 0o600
    finally:
        seen.update(_descendants(proc.pid))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: honcho stops its processes, then Redis stops
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid in seen - {proc.pid}:  # anything this run started that is still running (same pid, same cwd)
            try:
                if os.readlink(f"/proc/{pid}/cwd").startswith(str(clone)):
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
