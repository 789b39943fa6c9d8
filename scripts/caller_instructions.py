"""Instructions the caller spends per call (callgrind: a count, which the machine's load does not move).

    .venv/bin/python scripts/caller_instructions.py [--calls 300] [--what delay,many1,dramatiq] [ROOT ...]

``delay``: one ``dispatch.delay`` (a lone call on an idle process); ``many1``: ``dispatch_many`` of one
item; ``dramatiq``: Dramatiq's ``.send()`` (tools/bench_dramatiq.py), the peer's enqueue. Each ROOT is a
checkout (default: this one); for each, a process with its own redis-server and SQLite file (migrated
first, natively) warms up ``--warmup`` calls, then makes ``--calls`` calls inside one
``functools.reduce``, the only part callgrind counts (``--toggle-collect=functools_reduce``: the calling
thread's instructions inside it, the other threads' not). Prints instructions a call (Ir). A live
consumer is registered for the lane, as a serving lane has one; the once-a-second refreshes (estimate
inputs, the config's database check, Redis' memory) are made in the warm-up only.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _environment(root: Path, tmp: Path, url: str) -> dict[str, str]:
    return {"DJANGO_SETTINGS_MODULE": "dispatchsite.settings", "REDIS_URL": url,
            "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}", "DISPATCH_SECRETS_FILE": str(tmp / "secrets.json"),
            "DISPATCH_RUNTIME_FILE": str(tmp / "runtime.json"), "PYTHONHASHSEED": "0",
            "DISPATCH_MEMORY_CHECK_S": "3600"}


def child(root: Path, what: str, calls: int, warmup: int) -> None:
    """One measured process (run under callgrind by ``main``), the code of ``root``."""
    sys.path.insert(0, str(root))
    os.chdir(root)
    if what == "dramatiq":
        from tools.bench_dramatiq import dramatiq_work

        def step(_acc: int, i: int) -> int:
            dramatiq_work.send({"n": i, "ms": 0})
            return 0
    else:
        import django

        django.setup()
        from lanes import keys
        from lanes.lua import admit
        from lanes.redis_client import get_redis
        from tasks import config
        from tasks.dispatch import dispatch, dispatch_many
        from tests.support.helpers import define

        # The refreshes a process makes once a second or so (the estimate inputs, the config's database check,
        # Redis' memory) fall per call as the run's wall time goes, which valgrind stretches: counted once
        # (warm-up), not in the calls, they leave the per-call work alone.
        admit.ESTIMATE_INPUTS_TTL_S = config.DB_CHECK_INTERVAL_S = 3600.0
        define("instr.echo", lane="instr", capacity=10_000_000)
        get_redis().zadd(keys.lane_consumers("instr"), {"bench@host": int((time.time() + 3600) * 1000)})
        if what == "delay":
            def step(_acc: int, i: int) -> int:
                assert dispatch.delay("instr.echo", {"n": i, "ms": 0}).accepted
                return 0
        else:
            def step(_acc: int, i: int) -> int:
                assert dispatch_many("instr.echo", [{"n": i, "ms": 0}])[0].accepted
                return 0
    for i in range(warmup):
        step(0, i)
    functools.reduce(step, range(calls), 0)


def measure(root: Path, what: str, calls: int, warmup: int) -> float:
    """Instructions a call of ``what`` with the code of ``root``."""
    sys.path.insert(0, str(HERE))
    from tests.support.redis_server import RedisServer

    tmp = Path(tempfile.mkdtemp(prefix="caller-instructions-"))
    server = RedisServer(tmp / "redis", secrets.token_urlsafe(12), appendfsync="no").start()
    try:
        env = {**os.environ, **_environment(root, tmp, server.url)}
        if what != "dramatiq":
            subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=root, env=env,
                           check=True, capture_output=True)
        out = tmp / "cg.out"
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=functools_reduce",
                        f"--callgrind-out-file={out}", sys.executable, __file__, "--child", str(root), "--what", what,
                        "--calls", str(calls), "--warmup", str(warmup)],
                       cwd=root, env=env, check=True, capture_output=True)
        total = int(re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M).group(1))
        if os.environ.get("CALLGRIND_KEEP"):  # a folder: the dump kept for callgrind_annotate
            shutil.copy(out, Path(os.environ["CALLGRIND_KEEP"]) / f"cg.{what}.{root.name}")
        return total / calls
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("roots", nargs="*", type=Path)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--what", default="delay,many1")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child, opts.what, opts.calls, opts.warmup)
        return
    roots = [root.resolve() for root in opts.roots] or [HERE]
    for what in opts.what.split(","):
        for root in roots:
            ir = measure(root, what, opts.calls, opts.warmup)
            print(f"{what:9} {root}: {ir:,.0f} Ir/call  (load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
