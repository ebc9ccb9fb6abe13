"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import socket

REDIS_DEFAULT_PORT = 6379


def free_port(below: int = 65536) -> int:
    """A loopback port free right now, never Redis's default port (``below`` leaves room for a
    cluster bus port at port + 10000)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port < below and port != REDIS_DEFAULT_PORT:
            return port
