"""Real Celery worker processes for tests, each in its own process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).parent / "celery")
#: A worker's command: ``celery -A dispatchsite worker`` without the rest of Celery's CLI (dispatchsite.worker).
WORKER = [sys.executable, "-m", "dispatchsite.worker"]


class Worker:
    def __init__(self, queues: str, log_dir: Path, pool: str = "prefork", concurrency: int = 2,
                 env: dict[str, str] | None = None, name: str | None = None, extra: list[str] | None = None,
                 host: str | None = None, command: list[str] | None = None) -> None:
        self.queues = queues
        #: What starts it: ``WORKER``, or e.g. ``[CELERY, "-A", "dispatchsite", "worker"]`` (the same worker).
        self.command = command or WORKER
        self.name = name or f"w{uuid.uuid4().hex[:6]}"
        self.log_path = log_dir / f"worker-{self.name}.log"
        self.pool = pool
        self.concurrency = concurrency
        self.env = {**os.environ, **(env or {})}
        self.extra = extra or []
        #: A simulated host (``-n name@host``, ``DISPATCH_HOST_ID``): None for this machine's name.
        self.host = host
        if host:
            self.env["DISPATCH_HOST_ID"] = host
        self.proc: subprocess.Popen | None = None
        self._terminating = False
        self._log_offset = 0

    def start(self, timeout: float = 60) -> Worker:
        """Start it and wait until it says it is ready."""
        return self.launch().wait_ready(timeout)

    def launch(self) -> Worker:
        """Start the process without waiting for it (``wait_ready``): several start at once (``start_all``)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        self._terminating = False
        self.proc = subprocess.Popen(
            [*self.command, "-Q", self.queues, "-n", f"{self.name}@{self.host or '%h'}",
             "-P", self.pool, "-c", str(self.concurrency), "-l", "INFO", "--without-gossip", "--without-mingle",
             *self.extra],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        return self

    def wait_ready(self, timeout: float = 60) -> Worker:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited at start; log: {self.log_path}")
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                if b" ready." in fh.read():
                    return self
            time.sleep(0.02)  # a start is about 1 s: polled at 0.1 s, 50 ms of each was waiting to look
        raise RuntimeError(f"worker {self.name} not ready within {timeout}s; log: {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def children(self) -> list[int]:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def dump_stacks(self) -> None:
        """Every process of this worker writes its threads' stacks to the log (SIGUSR2)."""
        if self.alive():
            for pid in [self.pid, *self.children()]:
                try:
                    os.kill(pid, signal.SIGUSR2)
                except ProcessLookupError:
                    pass

    def terminate(self) -> None:
        """Start a warm shutdown (SIGTERM) without waiting: ``stop`` then waits for it.

        Stopping several workers, signal them all first: each takes a second or two.
        """
        if self.proc and self.proc.poll() is None and not self._terminating:
            self.proc.send_signal(signal.SIGTERM)
            self._terminating = True

    def stop(self, timeout: float = 30) -> None:
        """Warm shutdown (SIGTERM), then kill the group if it lingers."""
        if not self.proc:
            return
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reap_group()
        self.proc = None
        self._terminating = False

    def discard(self) -> None:
        """SIGKILL the whole process group, if still running, and forget it (a test's end)."""
        if not self.proc:
            return
        self._reap_group()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None
        self._terminating = False

    def retire(self, timeout: float = 60) -> None:
        """Kill it once it runs and holds no task (it answers remote control), waiting at most ``timeout``.

        The end of a worker whose shutdown is not under test: nothing is left running to be reclaimed on
        its lanes, and a warm shutdown would add only billiard's joins (2-3 s) to that wait.
        """
        import socket

        from celery import current_app

        destination = [f"{self.name}@{self.host or socket.gethostname()}"]
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            try:
                inspect = current_app.control.inspect(destination=destination, timeout=2.0, limit=1)
                active, reserved = inspect.active(), inspect.reserved()
            except Exception:  # noqa: BLE001 - remote control unreachable (a test restarted Redis): kill now
                break
            if active and reserved and not any(active.values()) and not any(reserved.values()):
                break
            time.sleep(0.2)
        self.discard()

    def kill(self) -> None:
        """SIGKILL the main process and its pool children (its process group)."""
        if not self.proc:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def _reap_group(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_all(workers: list[Worker], timeout: float = 60) -> list[Worker]:
    """Start several workers at once, each ready when this returns (a start is mostly one core's
    imports: two at once take little longer than one)."""
    for worker in workers:
        worker.launch()
    return [worker.wait_ready(timeout) for worker in workers]
