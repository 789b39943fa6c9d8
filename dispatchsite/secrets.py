"""Generated secrets kept in one git-ignored 0600 file beside the project.

Every process started in the project folder (web, workers, beat, Flower,
``manage.py`` commands) reads the same file, so they all reach the embedded
Redis and share the Django secret key without extra setup.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

#: ``redis_password`` is the platform's own Redis user (``dispatch``, no admin or dangerous commands);
#: ``redis_admin_password`` the embedded Redis's ``default`` user, for an operator's ``redis-cli``.
SECRET_NAMES = ("secret_key", "redis_password", "redis_admin_password", "admin_password", "flower_password",
                "metrics_token")


#: Django's deployment check (security.W009) wants a secret key of at least 50 characters.
MIN_SECRET_KEY_LEN = 50


def _generate() -> dict[str, str]:
    # 50 random bytes: a 67-character key (36 bytes made 48, under Django's minimum of 50).
    return {name: secrets.token_urlsafe(50 if name == "secret_key" else 18) for name in SECRET_NAMES}


def load_secrets(path: Path) -> dict[str, str]:
    """Read the secrets file, creating it (mode 0600, atomically) on first use."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        data = {}
    if len(data.get("secret_key") or "") < MIN_SECRET_KEY_LEN:
        data.pop("secret_key", None)  # too short for `check --deploy` (an older file): make a new one
    missing = [name for name in SECRET_NAMES if not data.get(name)]
    if not missing:
        return data
    data = {**_generate(), **{k: v for k, v in data.items() if v}}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a stale one (a crashed run with this pid) may have another mode
    # O_EXCL: a fresh file, 0600 from its creation (O_TRUNC on an existing file would keep its mode).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
    try:
        if path.exists():
            os.replace(tmp, path)  # an older file lacked a secret: complete it
        else:
            # Another process may win the race to create it: keep the first file.
            os.link(tmp, path)
    except FileExistsError:
        data = json.loads(path.read_text())
    finally:
        tmp.unlink(missing_ok=True)
    os.chmod(path, 0o600)
    return data
