"""Benchmark-only: a bench handler's start time, for the ``latency`` workload's enqueue->start figure.

A payload carrying ``t`` (the producer's ``time.time()`` just before it sent
the task) and ``ph`` (the phase) is recorded at the handler's entry as one
line ``phase, n, sent, started`` appended to ``$BENCH_LATENCY_DIR/lat-<pid>.txt``.
A file, not Redis, so the record adds no Redis command to any system and every
system (Celery, the platform, Dramatiq, Huey, taskiq) records the same way.
Imports nothing but the standard library: the peers' workers load it too.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_fds: dict[int, int] = {}
_lock = threading.Lock()


def record_start(payload: object, started: float) -> None:
    """Append the start of a timed task (a payload with ``t``); any other payload is ignored."""
    if not isinstance(payload, dict) or "t" not in payload:
        return
    directory = os.environ.get("BENCH_LATENCY_DIR")
    if not directory:
        return
    line = f"{payload.get('ph', '')}\t{payload.get('n', 0)}\t{float(payload['t'])!r}\t{started!r}\n"
    # One O_APPEND write per line: lines of threads and processes never interleave.
    os.write(_fd(directory), line.encode())


def _fd(directory: str) -> int:
    pid = os.getpid()
    fd = _fds.get(pid)
    if fd is None:
        with _lock:
            fd = _fds.get(pid)
            if fd is None:
                Path(directory).mkdir(parents=True, exist_ok=True)
                fd = _fds[pid] = os.open(Path(directory) / f"lat-{pid}.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                                         0o600)
    return fd


def read_starts(directory: Path | str) -> dict[tuple[str, int], tuple[float, float]]:
    """(phase, n) -> (sent, first start) of every recorded task (a redelivery keeps the first start)."""
    out: dict[tuple[str, int], tuple[float, float]] = {}
    for path in Path(directory).glob("lat-*.txt"):
        for raw in path.read_text().splitlines():
            parts = raw.split("\t")
            if len(parts) != 4:
                continue
            try:
                key, sent, started = (parts[0], int(parts[1])), float(parts[2]), float(parts[3])
            except ValueError:
                continue
            if key not in out or started < out[key][1]:
                out[key] = (sent, started)
    return out
