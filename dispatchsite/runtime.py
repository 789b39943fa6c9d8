"""The runtime file ``make run`` writes: the ports and URLs of the platform it is running.

``REDIS_PORT=16380 make run`` used to leave every other command (``manage.py
dispatch``, ``celery …``) aiming at the default port until the user exported
the variable again. ``make run`` now records what it used in a git-ignored
0600 file (``var/runtime.json``, or ``DISPATCH_RUNTIME_FILE``) and removes it
on exit; settings take their port and URL defaults from it while the process
that wrote it is alive. The environment still wins.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Names settings take from the file (it also holds the URLs, for people reading it).
RECORDED = ("WEB_PORT", "FLOWER_PORT", "REDIS_PORT", "REDIS_URL", "DISPATCH_HANDLER_MODULES")


def runtime_path(base_dir: Path, environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get("DISPATCH_RUNTIME_FILE") or base_dir / "var" / "runtime.json")


def read_runtime(path: Path) -> dict[str, Any]:
    """The file's values while its writer (``pid``) is alive; ``{}`` if absent, unreadable or stale."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or not _alive(data.get("pid")):
        return {}
    return {k: v for k, v in data.items() if k in RECORDED and v not in (None, "")}


def write_runtime(path: Path, values: Mapping[str, Any]) -> None:
    """Write the file atomically, mode 0600 (it may hold a Redis URL with its password)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({**values, "pid": os.getpid()}, fh, indent=2)
    os.replace(tmp, path)


def remove_runtime(path: Path) -> None:
    """Remove the file if this process wrote it (a second ``make run`` that failed must not remove the first's)."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def setting(name: str, default: str, runtime: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> str:
    """The environment's value, else the running platform's, else the default."""
    return environ.get(name) or str(runtime.get(name) or default)


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
