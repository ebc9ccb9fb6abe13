"""Reading where a ``redis.asyncio`` client connects, so that the core opens its own connection to
the same server with the same credentials and TLS settings."""

from __future__ import annotations

import itertools
import ssl
import weakref
from typing import Any
from urllib.parse import quote, urlencode

#: The embedded store of each ``fakeredis`` client given so far, by name: one client, one store.
_FAKE_STORES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_FAKE_NUMBERS = itertools.count(1)


def connection_of_redis_client(client: Any) -> tuple[str, str | None]:
    """The URL (and CA file, for TLS) of the server a ``redis.asyncio`` client talks to.

    A ``fakeredis`` client, an in-process stand-in for tests, is served by an embedded store
    instead (``memory://fakeredis-<n>``): there is no server to connect to. Every manager
    given the same client shares that store, as they would share the server.

    Raises ``TypeError`` for clients whose connection cannot be carried over faithfully.
    """
    if type(client).__module__.partition(".")[0] == "fakeredis":
        store = _FAKE_STORES.get(client)
        if store is None:
            store = _FAKE_STORES[client] = f"memory://fakeredis-{next(_FAKE_NUMBERS)}"
        return store, None
    nodes_manager = getattr(client, "nodes_manager", None)
    if nodes_manager is not None:
        kwargs = client.get_connection_kwargs()
        scheme = _scheme(kwargs, kwargs.get("connection_class"))
        nodes = list(nodes_manager.startup_nodes.values()) or client.get_nodes()
        hosts = ",".join(f"{_host(node.host)}:{node.port}" for node in nodes)
        return f"{scheme}+cluster://{_userinfo(kwargs)}{hosts}", kwargs.get("ssl_ca_certs")
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        raise TypeError(
            f"redis= must be a redis.asyncio.Redis or RedisCluster client, got "
            f"{type(client).__name__}; or pass url='redis://host:port/db'"
        )
    kwargs = pool.connection_kwargs
    sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", None)
    if sentinels is not None:
        if _scheme(kwargs, None) != "redis":
            raise TypeError("TLS behind Sentinel is not supported yet")
        hosts = ",".join(
            f"{_host(s.connection_pool.connection_kwargs['host'])}:"
            f"{s.connection_pool.connection_kwargs['port']}"
            for s in sentinels
        )
        db = kwargs.get("db", 0) or 0
        # The sentinels' own credentials (redis-py's sentinel_kwargs), the same on each.
        own = sentinels[0].connection_pool.connection_kwargs if sentinels else {}
        auth = urlencode(
            {f"sentinel_{k}": own[k] for k in ("username", "password") if own.get(k)},
            quote_via=quote,
        )
        url = f"redis+sentinel://{_userinfo(kwargs)}{hosts}/{pool.service_name}/{db}"
        return (f"{url}?{auth}" if auth else url), None
    scheme = _scheme(kwargs, pool.connection_class)
    db = kwargs.get("db", 0) or 0
    if kwargs.get("path"):
        query = {"db": db, "user": kwargs.get("username"), "pass": kwargs.get("password")}
        path = quote(kwargs["path"], safe="/")
        return f"unix://{path}?" + urlencode({k: v for k, v in query.items() if v}), None
    host = _host(kwargs.get("host", "localhost"))
    url = f"{scheme}://{_userinfo(kwargs)}{host}:{kwargs.get('port', 6379)}/{db}"
    return url, kwargs.get("ssl_ca_certs")


def _scheme(kwargs: dict[str, Any], connection_class: Any) -> str:
    if kwargs.get("credential_provider") is not None:
        raise TypeError(
            "clients with a credential_provider are not supported: pass "
            "url='redis://user:password@host:port/db'"
        )
    tls = kwargs.get("ssl") or (connection_class is not None and "SSL" in connection_class.__name__)
    if tls and kwargs.get("ssl_cert_reqs") in ("none", ssl.CERT_NONE):
        raise TypeError(
            "TLS clients that skip certificate checks are not followed: pass tls_ca_file= "
            "with the CA that signed Redis' certificate"
        )
    return "rediss" if tls else "redis"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _userinfo(kwargs: dict[str, Any]) -> str:
    username, password = kwargs.get("username"), kwargs.get("password")
    if not username and not password:
        return ""
    return f"{quote(username or '', safe='')}:{quote(password or '', safe='')}@"
