"""A throwaway PostgreSQL server (Debian's binaries) on a free loopback port.

Alone, for a measurement (``manage.py smsload``): ``python -m tests.support.postgres_server [--fsync]``
prints its ``DATABASE_URL`` and runs until SIGTERM or Ctrl-C, then removes its files.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.redis_server import free_port


def find_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


class PostgresServer:
    def __init__(self, fsync: bool = False) -> None:
        #: Off for tests (nothing to keep); on to measure as a real server commits (manage.py smsload's runs).
        self.fsync = fsync
        self.bindir = find_bindir()
        assert self.bindir, "PostgreSQL binaries not found"
        # Its own world-traversable folder: the server runs as the postgres user.
        self.base = Path(tempfile.mkdtemp(prefix="dispatch-pg-"))
        self.base.chmod(0o755)
        self.data_dir = self.base / "data"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def _as_postgres(self) -> list[str]:
        # PostgreSQL refuses to run as root; CI and these machines run tests as root.
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/dispatch"

    def start(self) -> PostgresServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            os.chown(self.data_dir, pg.pw_uid, pg.pw_gid)
        subprocess.run([*self._as_postgres(), str(self.bindir / "initdb"), "-D", str(self.data_dir), "-A", "trust",
                        "-U", "postgres", "-E", "UTF8"], check=True, capture_output=True)
        self.proc = subprocess.Popen(
            [*self._as_postgres(), str(self.bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
             "-k", str(self.data_dir), "-c", "listen_addresses=127.0.0.1",
             "-c", f"fsync={'on' if self.fsync else 'off'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(f"postgres://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
                    conn.execute("CREATE DATABASE dispatch")
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("PostgreSQL did not start") from None
                time.sleep(0.2)

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster itself, read from its pid file): a SIGTERM to
        ``runuser`` is forwarded and then followed by runuser's own two-second grace before it exits."""
        if self.proc and self.proc.poll() is None:
            try:
                os.kill(int((self.data_dir / "postmaster.pid").read_text().split()[0]), signal.SIGINT)
            except (OSError, ValueError, IndexError):  # not written yet, or gone: runuser's own way
                self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.base, ignore_errors=True)


def main() -> None:
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="A throwaway PostgreSQL on loopback until SIGTERM / Ctrl-C")
    parser.add_argument("--fsync", action="store_true", help="commit to disk as a real server does (default: off)")
    server = PostgresServer(fsync=parser.parse_args().fsync).start()
    print(server.url, flush=True)

    def stop(*_: object) -> None:
        server.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
