"""Real ``redis-server`` processes started by the tests on free loopback ports (never 6379)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def redis_binary(name: str = "redis-server") -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(
            f"{name} is not on PATH: run `make test` (it installs Debian's redis-server), "
            f"or install it with `apt-get install redis-server redis-tools`"
        )
    return path


def free_port(below: int = 65536) -> int:
    """A free loopback port (``below`` leaves room for a cluster bus port at port + 10000)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port < below and port != 6379:
            return port


def wait_until(condition, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Polls ``condition`` until it returns a truthy value or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class RedisServer:
    """One redis-server on 127.0.0.1, in a temporary directory; can be killed and restarted."""

    def __init__(self, *extra_args: str, port: int | None = None) -> None:
        self.port = port or free_port(below=55536 if "--cluster-enabled" in extra_args else 65536)
        self.extra_args = list(extra_args)
        self.dir = Path(tempfile.mkdtemp(prefix="stream-lease-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        tls = "--tls-port" in self.extra_args
        args = [
            redis_binary(),
            "--port", "0" if tls else str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir
        )
        wait_until(self._started, what=f"redis-server on port {self.port}")
        return self

    def _started(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            code, args = self.process.returncode, self.process.args
            raise RuntimeError(f"redis-server exited with {code}: {args}")
        return self.ping()

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
        return subprocess.run(
            [redis_binary("redis-cli"), "-p", str(self.port), *args],
            check=True, capture_output=True, text=True, timeout=10,
        ).stdout.strip()

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


class RedisCluster:
    """Three masters (no replicas) on loopback, created with ``redis-cli --cluster create``."""

    def __init__(self) -> None:
        self.nodes = [RedisServer("--cluster-enabled", "yes", "--cluster-node-timeout", "2000")
                      for _ in range(3)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [redis_binary("redis-cli"), "--cluster", "create",
             *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        wait_until(
            lambda: all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes),
            timeout=30, what="cluster_state:ok on every node",
        )
        return self

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


def make_tls_files(directory: Path) -> dict[str, Path]:
    """A private CA and a server certificate for 127.0.0.1 and localhost, made with openssl."""
    files = {name: directory / f"{name}.pem" for name in ("ca", "ca-key", "server", "server-key")}

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=stream-lease test CA",
            "-keyout", str(files["ca-key"]), "-out", str(files["ca"]))
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    request = directory / "server.csr"
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", str(files["server-key"]), "-out", str(request))
    openssl("x509", "-req", "-in", str(request), "-CA", str(files["ca"]),
            "-CAkey", str(files["ca-key"]), "-CAcreateserial", "-days", "2",
            "-extfile", str(extensions), "-out", str(files["server"]))
    return files


def tls_server(directory: Path) -> RedisServer:
    files = make_tls_files(directory)
    port = free_port()
    return RedisServer(
        "--tls-port", str(port), "--tls-cert-file", str(files["server"]),
        "--tls-key-file", str(files["server-key"]), "--tls-ca-cert-file", str(files["ca"]),
        "--tls-auth-clients", "no", port=port,
    )


class SentinelSetup:
    """A master, a replica and one sentinel watching them (quorum 1), on loopback."""

    def __init__(self, directory: Path) -> None:
        self.master = RedisServer()
        self.replica = RedisServer()
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
        )
        self.sentinel = subprocess.Popen(
            [redis_binary(), str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: RedisServer(port=self.sentinel_port).ping(), what="the sentinel")
        return self

    def master_port(self) -> int:
        reply = subprocess.run(
            [redis_binary("redis-cli"), "-p", str(self.sentinel_port),
             "sentinel", "get-master-addr-by-name", "lease-master"],
            check=True, capture_output=True, text=True, timeout=10,
        ).stdout.split()
        return int(reply[1])

    def cleanup(self) -> None:
        if self.sentinel is not None:
            self.sentinel.kill()
            self.sentinel.wait(timeout=10)
        self.master.cleanup()
        self.replica.cleanup()
