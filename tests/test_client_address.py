"""Limits per client address believe only the header the app's trusted proxies write, and only
from those proxies: a client that forges ``Forwarded``, ``X-Forwarded-For``, ``X-Real-IP`` or a
custom header is still counted under its own address, by every form that counts per address
(the dependency, the decorator, the middleware, the WebSocket guard). Through a real uvicorn
(the test client is the peer, 127.0.0.1) and real HTTP and WebSocket clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from ipaddress import ip_network
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager, client_ip

from support.apps import APPS_DIR
from support.uvicorn_server import Uvicorn

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 3  # tests/apps/per_address_limits.py: each form allows 3 requests a minute per address
FORMS = ["/dependency", "/decorator", "/middleware", "/ws"]
CLIENT = "198.51.100.7"  # the client's address, as the app's trusted proxy writes it
OTHER_CLIENT = "198.51.100.8"

Headers = Callable[[int], dict[str, str]]


def forged(n: int) -> dict[str, str]:
    """Every header a client can write, naming a new address each time."""
    address = f"203.0.113.{n}"
    return {
        "Forwarded": f"for={address}",
        "X-Forwarded-For": address,
        "X-Real-IP": address,
        "CF-Connecting-IP": address,
    }


# Each: the app's trusted proxies and proxy header, uvicorn's proxy-header flags, what a
# request carries (n: the request's number; each form must count all of them as one address),
# and, where a trusted proxy's header names the client, the headers of another client.
SETUPS: dict[str, tuple[str, str, tuple[str, ...], Headers, dict[str, str] | None]] = {
    "no trusted proxies": ("", "", ("--no-proxy-headers",), forged, None),
    "a custom header from a peer that is no proxy": (
        "10.0.0.0/8", "X-Real-IP", ("--no-proxy-headers",), forged, None
    ),
    "X-Forwarded-For from a trusted proxy": (
        "127.0.0.1", "", ("--no-proxy-headers",),
        lambda n: {**forged(n), "X-Forwarded-For": f"203.0.113.{n}, {CLIENT}"},
        {"X-Forwarded-For": OTHER_CLIENT},
    ),
    "Forwarded from a trusted proxy": (
        "127.0.0.1", "Forwarded", ("--no-proxy-headers",),
        lambda n: {**forged(n), "Forwarded": f'for=203.0.113.{n}, for="{CLIENT}:4711"'},
        {"Forwarded": f"for={OTHER_CLIENT}"},
    ),
    "a custom header from a trusted proxy": (
        "127.0.0.1", "CF-Connecting-IP", ("--no-proxy-headers",),
        lambda n: {**forged(n), "CF-Connecting-IP": CLIENT},
        {"CF-Connecting-IP": OTHER_CLIENT},
    ),
    "uvicorn's --proxy-headers, on by default": (
        "", "", (),
        lambda n: {**forged(n), "X-Forwarded-For": f"203.0.113.{n}, {CLIENT}"},
        {"X-Forwarded-For": OTHER_CLIENT},
    ),
}


@pytest.fixture(params=SETUPS)
def setup(
    request: pytest.FixtureRequest, backend_url: str, key_prefix: str
) -> Iterator[tuple[Uvicorn, Headers, dict[str, str] | None]]:
    trusted, header, uvicorn_flags, headers, other_client = SETUPS[request.param]
    env = {
        "STREAM_LEASE_URL": backend_url,
        "STREAM_LEASE_PREFIX": key_prefix,
        "TRUSTED_PROXIES": trusted,
        "PROXY_HEADER": header,
    }
    server = Uvicorn("per_address_limits:app", APPS_DIR, env, *uvicorn_flags)
    yield server, headers, other_client
    server.stop()


def admitted(server: Uvicorn, form: str, headers: dict[str, str]) -> bool:
    if form == "/ws":
        url = server.base_url.replace("http://", "ws://") + form
        try:
            with connect(url, additional_headers=headers) as websocket:
                return websocket.recv(timeout=10) == "ok"
        except InvalidStatus as refused:
            assert refused.response.status_code == 403
            return False
    response = httpx.get(server.base_url + form, headers=headers, timeout=10)
    assert response.status_code in (200, 429), response.text
    return response.status_code == 200


@pytest.mark.parametrize("form", FORMS)
def test_a_forged_forwarding_header_does_not_make_a_new_client(setup, form):
    """A client that names a new address in each request's forwarding headers gets the
    limit once, not once per address it makes up; another client named by a trusted proxy
    has an allowance of its own."""
    server, headers, other_client = setup
    assert [admitted(server, form, headers(n)) for n in range(2 * LIMIT)] == [
        True
    ] * LIMIT + [False] * LIMIT
    if other_client is not None:
        assert admitted(server, form, other_client)


def test_the_login_example_refuses_a_guesser_who_forges_forwarded(backend_url):
    """examples/login.py behind a proxy that writes X-Forwarded-For (the test client, on its
    default trusted proxy 127.0.0.1): a guesser who names a new address in ``Forwarded`` with
    each guess gets the 5 guesses a minute of its own address, not 5 per made-up address."""
    server = Uvicorn(
        "login:app", ROOT / "examples", {"REDIS_URL": backend_url}, "--no-proxy-headers"
    )
    try:
        guesses = [
            httpx.post(
                server.base_url + "/login",
                json={"username": "alice", "password": f"guess {n}"},
                headers={"Forwarded": f"for=203.0.113.{n}", "X-Forwarded-For": CLIENT},
                timeout=10,
            ).status_code
            for n in range(10)
        ]
    finally:
        server.stop()
    assert guesses == [401] * 5 + [429] * 5


def connection(peer: str | None, *headers: tuple[str, str]) -> Request:
    return Request({
        "type": "http",
        "client": (peer, 40000) if peer else None,
        "headers": [(name.lower().encode(), value.encode()) for name, value in headers],
    })


PROXIES = ["10.0.0.0/8", "fd00::/8"]


@pytest.mark.parametrize(
    ("peer", "header", "headers", "client"),
    [
        # Another header than the one named is the client's own text.
        ("10.0.0.1", "X-Forwarded-For", [("Forwarded", "for=203.0.113.9")], "10.0.0.1"),
        ("10.0.0.1", "X-Forwarded-For", [("X-Real-IP", "203.0.113.9")], "10.0.0.1"),
        ("10.0.0.1", "Forwarded", [("X-Forwarded-For", "203.0.113.9")], "10.0.0.1"),
        ("10.0.0.1", "X-Real-IP", [("CF-Connecting-IP", "203.0.113.9")], "10.0.0.1"),
        # The named header from a peer that is no proxy, likewise.
        ("198.51.100.1", "X-Forwarded-For", [("X-Forwarded-For", "203.0.113.9")], "198.51.100.1"),
        ("198.51.100.1", "X-Real-IP", [("X-Real-IP", "203.0.113.9")], "198.51.100.1"),
        # Lines joined in order, walked from the right past the trusted proxies.
        (
            "10.0.0.1", "X-Forwarded-For",
            [("X-Forwarded-For", "192.0.2.1, 203.0.113.9"), ("X-Forwarded-For", "10.0.0.2")],
            "203.0.113.9",
        ),
        (
            "fd00::1", "Forwarded",
            [("Forwarded", "for=192.0.2.1"), ("Forwarded", 'for="[2001:db8::7]:4711";proto=https')],
            "2001:db8::7",
        ),
        # A malformed entry stops the walk at the last address before it.
        ("10.0.0.1", "X-Forwarded-For", [("X-Forwarded-For", "192.0.2.1, nonsense")], "10.0.0.1"),
        ("10.0.0.1", "X-Forwarded-For", [("X-Forwarded-For", "192.0.2.1, unknown")], "10.0.0.1"),
        ("10.0.0.1", "Forwarded", [("Forwarded", "for=192.0.2.1, for=_hidden")], "10.0.0.1"),
        # The header absent: the peer is the client.
        ("10.0.0.1", "CF-Connecting-IP", [], "10.0.0.1"),
        ("10.0.0.1", "CF-Connecting-IP", [("CF-Connecting-IP", "203.0.113.9")], "203.0.113.9"),
        # A header of one address: its last line, when that is one address.
        (
            "10.0.0.1", "X-Real-IP",
            [("X-Real-IP", "192.0.2.1"), ("X-Real-IP", "203.0.113.9")], "203.0.113.9",
        ),
        ("10.0.0.1", "X-Real-IP", [("X-Real-IP", "192.0.2.1, 203.0.113.9")], "10.0.0.1"),
        # An IPv4-mapped peer is its IPv4 address.
        ("::ffff:10.0.0.1", "X-Forwarded-For", [("X-Forwarded-For", "203.0.113.9")], "203.0.113.9"),
        ("::ffff:198.51.100.1", "X-Forwarded-For", [], "198.51.100.1"),
        (None, "X-Forwarded-For", [("X-Forwarded-For", "203.0.113.9")], "unknown"),
    ],
)
def test_only_the_named_header_from_a_trusted_proxy_names_the_client(peer, header, headers, client):
    assert client_ip(connection(peer, *headers), PROXIES, header) == client
    manager = StreamLeaseManager(config=LeaseConfig(trusted_proxies=PROXIES, proxy_header=header))
    assert manager.client_ip(connection(peer, *headers)) == client


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"proxy_header": ""}, ValueError, "proxy_header '' is not a header name"),
        ({"proxy_header": "X Real IP"}, ValueError, "'X Real IP' is not a header name: name the"),
        ({"proxy_header": b"X-Real-IP"}, TypeError, "proxy_header must be a str"),
        ({"trusted_proxies": ["10.0.0.0/33"]}, ValueError, "'10.0.0.0/33' is not a network"),
        # Regression: an IPv4-mapped network was accepted and never matched (every client
        # behind such a proxy shared one bucket, the proxy's).
        (
            {"trusted_proxies": ["::ffff:10.0.0.0/104"]},
            ValueError,
            "never match.*write it as '10.0.0.0/8'",
        ),
        ({"trusted_proxies": "10.0.0.0/8"}, TypeError, "must be a list of networks"),
        ({"trusted_proxies": [ip_network("10.0.0.0/8")]}, TypeError, "write each network as a str"),
    ],
)
def test_bad_proxy_settings_fail_at_start_up(settings, error, message):
    with pytest.raises(error, match=message):
        LeaseConfig(**settings)
    with pytest.raises(error, match=message):
        client_ip(connection("10.0.0.1"), **settings)


def test_the_proxy_settings_are_kept():
    config = LeaseConfig(trusted_proxies=["10.0.0.0/8"], proxy_header="CF-Connecting-IP")
    assert (config.trusted_proxies, config.proxy_header) == (["10.0.0.0/8"], "CF-Connecting-IP")
    assert LeaseConfig().proxy_header == "X-Forwarded-For"
    assert 'proxy_header="CF-Connecting-IP"' in repr(config)
