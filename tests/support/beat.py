"""Real ``celery beat`` processes for tests (the settings' scheduler, tasks.beat), each in its own process group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tests.support.workers import CELERY, ROOT


class Beat:
    def __init__(self, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = f"beat{uuid.uuid4().hex[:6]}"
        self.log_path = log_dir / f"{self.name}.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> Beat:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        # --pidfile= : no pid file, so two beats can run from one folder (the point of some tests).
        self.proc = subprocess.Popen(
            [CELERY, "-A", "dispatchsite", "beat", "-l", "INFO", "--pidfile=", "--max-interval", "1"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"beat exited at start; log: {self.log_path}:\n{self.log_text()[-3000:]}")
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                if b"beat: Starting..." in fh.read():
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"beat not started within {timeout}s; log: {self.log_path}")

    def kill(self) -> None:
        """SIGKILL the process group (a crash: nothing is flushed) and wait for it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.proc = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
