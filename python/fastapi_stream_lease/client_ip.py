"""The client's IP address behind reverse proxies: read from the one header the app's proxies
write, and only when the peer is one of them (the rule itself is the core's,
``LeaseConfig(trusted_proxies=..., proxy_header=...)``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ._core import ProxyRule

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection


def client_ip(
    request: HTTPConnection,
    trusted_proxies: Iterable[str] = (),
    proxy_header: str = "X-Forwarded-For",
) -> str:
    """The address of the client that sent ``request`` (an HTTP request or a WebSocket).

    ``proxy_header`` is the header the reverse proxies in ``trusted_proxies`` (addresses or
    CIDR networks) write the client's address into: ``X-Forwarded-For`` (nginx, AWS ALB,
    HAProxy), ``Forwarded`` (RFC 7239), or a header of one address that the proxy sets, such as
    ``X-Real-IP`` or ``CF-Connecting-IP``. It is read only when the peer is a trusted proxy;
    every other header, and this one from any other peer, is the client's own text and is
    ignored. Without the header the peer is the client. ``X-Forwarded-For`` and ``Forwarded``
    (their lines joined in order) are walked from the right, the hop nearest to us, past every
    trusted proxy: the first address that is not one is the client; a malformed entry stops the
    walk at the last address before it. Without a peer (a test client) the answer is
    ``"unknown"``.

    An app with a :class:`~fastapi_stream_lease.StreamLeaseManager` calls
    :meth:`~fastapi_stream_lease.StreamLeaseManager.client_ip`, which uses its ``LeaseConfig``.
    Behind uvicorn, whose ``--proxy-headers`` (on by default) rewrites the peer from
    ``X-Forwarded-For`` for the hosts in ``--forwarded-allow-ips`` (127.0.0.1 and ::1 by
    default), use one mechanism, not both: name the proxies here and run uvicorn with
    ``--no-proxy-headers``, or leave ``trusted_proxies`` empty and list the proxies in
    ``--forwarded-allow-ips``.
    """
    return client_of(request, ProxyRule(trusted_proxies, proxy_header))


def client_of(connection: HTTPConnection, rule: ProxyRule) -> str:
    """The address of ``connection``'s client by ``rule``."""
    peer = connection.client.host if connection.client else None
    return rule.client(peer, connection.headers.getlist(rule.header))
