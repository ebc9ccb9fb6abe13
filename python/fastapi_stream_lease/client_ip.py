"""The client's IP address behind reverse proxies, trusting forwarding headers only from the
proxies the app names."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address


def trusted_networks(proxies: Iterable[str | Network]) -> tuple[Network, ...]:
    """``["10.0.0.0/8", "127.0.0.1"]`` as networks; an entry that is not one is a ValueError
    that names it (so a typo fails at start-up, not per request)."""
    if isinstance(proxies, str):
        raise TypeError(
            "trusted_proxies must be a list of networks, e.g. ['10.0.0.0/8'], not a str"
        )
    networks = []
    for entry in proxies:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except (TypeError, ValueError):
            raise ValueError(
                f"trusted proxy {entry!r} is not a network: use an address or CIDR such as "
                "'10.0.0.0/8', '192.168.1.7' or 'fd00::/8'"
            ) from None
    return tuple(networks)


def client_ip(request: HTTPConnection, trusted_proxies: Sequence[str | Network] = ()) -> str:
    """The address of the client that sent ``request`` (an HTTP request or a WebSocket).

    The forwarding headers (``Forwarded``, RFC 7239, else ``X-Forwarded-For``) are read only when
    the peer is one of ``trusted_proxies``; then the chain is walked from the right (the hop
    closest to us) past every trusted proxy, and the first address that is not one is the
    client. A header from any other peer is ignored (a client can write what it likes there),
    and so is a malformed entry: the walk stops at the last well-formed address. Without a peer
    (a test client) the answer is ``"unknown"``.

    Behind uvicorn's ``--proxy-headers`` the peer is already rewritten from ``X-Forwarded-For``
    (for the hosts in ``--forwarded-allow-ips``); use one mechanism, not both: either leave
    ``--proxy-headers`` off and name the proxies here, or trust uvicorn and pass no proxies.
    """
    networks = trusted_networks(trusted_proxies)
    peer = request.client.host if request.client else None
    address = _address(peer)
    if address is None:
        return peer or "unknown"
    chain = _forwarded_for(request)
    while chain and _trusted(address, networks):
        hop = _address(chain.pop())
        if hop is None:
            break
        address = hop
    return str(address)


def _trusted(address: Address, networks: Sequence[Network]) -> bool:
    return any(address.version == n.version and address in n for n in networks)


def _forwarded_for(request: HTTPConnection) -> list[str]:
    """The addresses the proxies appended, left (client side) to right (our side)."""
    forwarded = request.headers.getlist("forwarded")
    if forwarded:
        hops = []
        for element in ",".join(forwarded).split(","):
            for pair in element.split(";"):
                name, _, value = pair.strip().partition("=")
                if name.lower() == "for":
                    hops.append(_strip_node(value.strip().strip('"')))
        return hops
    forwarded_for = request.headers.getlist("x-forwarded-for")
    return [hop.strip() for hop in ",".join(forwarded_for).split(",") if hop.strip()]


def _strip_node(node: str) -> str:
    """An RFC 7239 node without its port: ``[2001:db8::1]:4711`` -> ``2001:db8::1``,
    ``192.0.2.43:47011`` -> ``192.0.2.43``."""
    if node.startswith("["):
        return node[1:].partition("]")[0]
    if node.count(":") == 1:
        return node.partition(":")[0]
    return node


def _address(text: str | None) -> Address | None:
    if not text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
