"""Redis URLs fit to print or store."""

from __future__ import annotations

from urllib.parse import urlsplit


def without_password(url: str) -> str:
    """``url`` with its password, if it has one, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, host_and_port = parts.netloc.rpartition("@")
    username = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{username}:***@{host_and_port}").geturl()
