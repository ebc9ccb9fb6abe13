"""Redis URLs fit to print or store."""

from __future__ import annotations


def without_password(url: str) -> str:
    """``url`` with its credentials hidden as the core hides them (``src/backend/redis/url.rs``):
    everything between ``://`` and the last ``@`` becomes ``user:***`` (``***`` when the user
    name is not plain), since a password may hold ``/ ? @ :`` unencoded."""
    scheme, separator, rest = url.partition("://")
    if not separator or scheme.endswith("unix") or "@" not in rest:
        return url
    userinfo, _, hosts = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    plain = colon and not any(c in user for c in "/?#@[]")
    return f"{scheme}://{user + ':***' if plain else '***'}@{hosts}"
