"""A real Redis server (the binary ``make run`` starts: dispatchsite.redis_server) on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis

from dispatchsite.redis_server import server_path
from lanes.capacity import REDIS_CONFIG


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, data_dir: Path, password: str, port: int | None = None, appendfsync: str = "always",
                 appendonly: bool = True) -> None:
        self.data_dir = data_dir
        self.password = password
        self.port = port or free_port()
        self.port_chosen_here = port is None
        self.appendfsync = appendfsync
        self.appendonly = appendonly  # False: start from the folder's dump.rdb (a kept scenario's evidence)
        self.proc: subprocess.Popen | None = None
        self.started_once = False

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5)

    def start(self) -> RedisServer:
        """Start and wait for PING. A port taken meanwhile (another process bound it between
        ``free_port`` and here, or during a restart) is retried: a new port on a first start
        whose port was chosen here, the same one (clients know it) on a restart."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir / "redis.log"
        for attempt in range(6):
            args = [
                server_path(), "--port", str(self.port), "--bind", "127.0.0.1", "--requirepass", self.password,
                "--dir", str(self.data_dir), "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", self.appendfsync,
                "--save", "", "--daemonize", "no", "--loglevel", "warning",
                *(arg for name, value in REDIS_CONFIG.items() for arg in (f"--{name}", value)),
            ]
            offset = log_path.stat().st_size if log_path.exists() else 0
            self.log = open(log_path, "ab")
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
            if self._wait_ready(log_path):
                self.started_once = True
                return self
            tail = log_path.read_bytes()[offset:].decode(errors="replace")
            if "Address already in use" not in tail or attempt == 5:
                raise RuntimeError(f"redis-server exited (port {self.port}): {tail[-2000:]}")
            if self.port_chosen_here and not self.started_once:
                self.port = free_port()
            else:
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def _wait_ready(self, log_path: Path) -> bool:
        """True once it answers PING; False when it exited (the caller reads why)."""
        assert self.proc is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.client().ping()
                return True
            except redis.RedisError:
                if self.proc.poll() is not None:
                    return False
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer within 20 s: see {log_path}")

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None
