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

import json
import stat
from pathlib import Path

import pytest

from tests.support.make_run import copy_project, http_status, make_run, plain_env
from tests.support.redis_server import free_port

START_TIMEOUT_S = 180


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
    root = copy_project(tmp_path / "project")
    (root / "var" / "redis").mkdir(parents=True)
    (root / "var").chmod(0o755)
    (root / "var" / "redis").chmod(0o755)
    old = root / "var" / "redis" / "redis.conf"
    old.write_text("# from an older run\n")
    old.chmod(0o644)
    return root


def test_make_run_keeps_var_private_and_secrets_off_command_lines(clone):
    web, flower, redis_port = free_port(), free_port(), free_port()
    env = plain_env()
    env.update({"WEB_PORT": str(web), "FLOWER_PORT": str(flower), "REDIS_PORT": str(redis_port),
                "WORKER_GROUPS": json.dumps({"d": "default,ingress"}), "WORKER_POOL": "solo",
                "WORKER_CONCURRENCY": "1", "WORKER_LOGLEVEL": "WARNING", "REDIS_APPENDFSYNC": "everysec"})

    def up() -> bool:
        return (http_status(f"http://127.0.0.1:{flower}/") is not None
                and http_status(f"http://127.0.0.1:{web}/admin/login/") == 200)

    # umask 022 is what a login shell usually has: run.py must not rely on it.
    with make_run(clone, env, up, timeout_s=START_TIMEOUT_S, umask=0o022) as run:
        secrets = json.loads((clone / ".dispatch-secrets.json").read_text())

        # Flower asks for the credentials it read from FLOWER_BASIC_AUTH.
        assert http_status(f"http://127.0.0.1:{flower}/") == 401
        assert http_status(f"http://127.0.0.1:{flower}/", ("admin", secrets["flower_password"])) == 200

        # No command line on the machine holds a password.
        for pid, cmdline in _cmdlines().items():
            for name in ("flower_password", "redis_password", "admin_password", "metrics_token", "secret_key"):
                assert secrets[name] not in cmdline, (pid, name, cmdline[:200])
        ours = _cmdlines()
        assert any("flower" in ours.get(pid, "") for pid in run.seen)
        assert not any("basic-auth" in ours.get(pid, "") or "requirepass" in ours.get(pid, "") for pid in run.seen)

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
