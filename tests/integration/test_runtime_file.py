"""Commands find the running platform: settings take ports from ``make run``'s runtime file; the environment wins."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("from django.conf import settings as s; import json; print(json.dumps({'redis_port': s.REDIS_PORT, "
         "'redis_url': s.REDIS_URL, 'admin': s.DISPATCH_ADMIN_URL, 'flower': s.FLOWER_URL}))")


def _settings(runtime_file: Path, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items()
            if k not in {"REDIS_URL", "REDIS_PORT", "WEB_PORT", "FLOWER_PORT", "FLOWER_URL", "DISPATCH_ADMIN_URL"}}
    done = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {PROBE}"], cwd=ROOT,
                          env={**base, "DJANGO_SETTINGS_MODULE": "dispatchsite.settings",
                               "DISPATCH_RUNTIME_FILE": str(runtime_file), **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _write(path: Path, pid: int, **values) -> None:
    path.write_text(json.dumps({"pid": pid, **values}))


def test_settings_take_ports_from_a_live_runtime_file(tmp_path):
    runtime = tmp_path / "runtime.json"
    _write(runtime, os.getpid(), REDIS_PORT=16380, WEB_PORT=18001, FLOWER_PORT=18002)
    got = _settings(runtime)
    assert got["redis_port"] == 16380 and "@127.0.0.1:16380/0" in got["redis_url"]
    assert got["admin"] == "http://127.0.0.1:18001/admin/" and got["flower"] == "http://127.0.0.1:18002/"


def test_the_environment_wins_over_the_runtime_file(tmp_path):
    runtime = tmp_path / "runtime.json"
    _write(runtime, os.getpid(), REDIS_PORT=16380, WEB_PORT=18001)
    got = _settings(runtime, REDIS_PORT="17001", WEB_PORT="17002")
    assert got["redis_port"] == 17001 and "@127.0.0.1:17001/0" in got["redis_url"]
    assert got["admin"] == "http://127.0.0.1:17002/admin/"
    got = _settings(runtime, REDIS_URL="redis://:pw@127.0.0.1:17009/0")
    assert got["redis_url"] == "redis://:pw@127.0.0.1:17009/0"


def test_a_stale_or_missing_runtime_file_gives_the_defaults(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    runtime = tmp_path / "runtime.json"
    _write(runtime, int(dead.stdout), REDIS_PORT=16380)
    assert _settings(runtime)["redis_port"] == 6380
    assert _settings(tmp_path / "absent.json")["redis_port"] == 6380


def test_write_is_0600_and_only_the_writer_removes_it(tmp_path):
    from dispatchsite.runtime import read_runtime, remove_runtime, write_runtime

    runtime = tmp_path / "var" / "runtime.json"
    write_runtime(runtime, {"REDIS_PORT": 16380, "ADMIN_URL": "http://127.0.0.1:18001/admin/"})
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o600
    assert read_runtime(runtime) == {"REDIS_PORT": 16380}
    _write(runtime, 1, REDIS_PORT=1)  # another writer's file
    remove_runtime(runtime)
    assert runtime.exists()
    write_runtime(runtime, {"REDIS_PORT": 16380})
    remove_runtime(runtime)
    assert not runtime.exists()
