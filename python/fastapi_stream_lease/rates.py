"""Request-rate limits: :class:`RateLimit` policies and what each decided about a hit
(:class:`RateDecision`), both from the core; the IETF ``RateLimit-Policy`` / ``RateLimit``
headers; the :class:`Prices` of models, for budgets in money (``unit="cost"``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from ._core import Prices, RateDecision, RateLimit, rate_limit_header_values

__all__ = ["Prices", "RateDecision", "RateLimit", "openai_rate_limit_headers", "rate_limit_headers"]

#: A policy of a call: a ``RateLimit`` counting the call's identity (the user), or a
#: ``(RateLimit, identity)`` pair counting that identity (a team, an API key, ``"org|model"``).
PolicyEntry: TypeAlias = RateLimit | tuple[RateLimit, str]


def policy_of(entry: PolicyEntry) -> RateLimit:
    """The ``RateLimit`` of a call's policy, with or without an identity of its own."""
    return entry[0] if isinstance(entry, tuple) else entry


def rate_limit_headers(
    decisions: Sequence[RateDecision], pools: Sequence[tuple[str, int, int]] = ()
) -> dict[str, str]:
    """``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-ratelimit-headers-11) for the
    decisions of one hit: quota ``q`` per window ``w`` seconds, ``r`` remaining, ``t`` seconds
    until units free up; and for a stream's capped ``pools`` (``lease.pool_usage``: name,
    capacity, slots in use), ``q`` slots with ``qu="concurrent-requests"``. Send them before a
    stream's first byte (never in trailers)."""
    values = rate_limit_header_values(decisions, pools)
    if values is None:
        return {}
    return {"RateLimit-Policy": values[0], "RateLimit": values[1]}


def _duration(seconds: float) -> str:
    """A wait as OpenAI writes it: ``"20ms"``, ``"1s"``, ``"6m0s"``, ``"1h2m3.5s"``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{int(hours)}h" if hours else ""
    if hours or minutes:
        text += f"{int(minutes)}m"
    return f"{text}{round(secs, 3):g}s"


def openai_rate_limit_headers(decisions: Sequence[RateDecision]) -> dict[str, str]:
    """The ``x-ratelimit-limit-*``, ``x-ratelimit-remaining-*`` and ``x-ratelimit-reset-*``
    headers that OpenAI's API sends and LLM SDK clients read, for ``requests`` (the request-rate
    policy with the fewest units left) and ``tokens`` (the token budget with the fewest left,
    after the stream's reservation)."""
    headers: dict[str, str] = {}
    for kind, counted in (
        ("requests", {"requests"}),
        ("tokens", {"tokens", "input_tokens", "output_tokens"}),
    ):
        of_kind = [d for d in decisions if d.policy.unit in counted]
        if not of_kind:
            continue
        tightest = min(of_kind, key=lambda d: (d.remaining, -d.reset))
        headers[f"x-ratelimit-limit-{kind}"] = str(tightest.limit)
        headers[f"x-ratelimit-remaining-{kind}"] = str(tightest.remaining)
        headers[f"x-ratelimit-reset-{kind}"] = _duration(tightest.reset)
    return headers
