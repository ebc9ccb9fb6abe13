"""Request-rate limits: :class:`RateLimit` policies (from the core), what each decided about a
hit (:class:`RateDecision`), and the IETF ``RateLimit-Policy`` / ``RateLimit`` headers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._core import RateLimit

__all__ = ["RateDecision", "RateLimit", "rate_limit_headers"]


@dataclass(frozen=True)
class RateDecision:
    """What one policy said about a hit: its ``limit`` (the policy's, or this process's share
    of it while Redis is down under ``failure_mode="open"``), ``remaining`` units in its window
    after the hit (before it, when refused or only looked at), and ``reset``, seconds until its
    next units free up (0 when nothing is in use)."""

    policy: RateLimit
    limit: int
    remaining: int
    reset: float


def _seconds(value: float) -> int:
    return math.ceil(value)


def rate_limit_headers(
    decisions: Sequence[RateDecision], pools: Sequence[tuple[str, int, int]] = ()
) -> dict[str, str]:
    """``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-ratelimit-headers-11) for the
    decisions of one hit: quota ``q`` per window ``w`` seconds, ``r`` remaining, ``t`` seconds
    until units free up; and for a stream's capped ``pools`` (``lease.pool_usage``: name,
    capacity, slots in use), ``q`` slots with ``qu="concurrent-requests"``. Send them before a
    stream's first byte (never in trailers)."""
    policies = [f'"{d.policy.name}";q={d.limit};w={_seconds(d.policy.per)}' for d in decisions]
    states = [f'"{d.policy.name}";r={d.remaining};t={_seconds(d.reset)}' for d in decisions]
    for name, capacity, used in pools:
        policies.append(f'"{name}";q={capacity};qu="concurrent-requests"')
        states.append(f'"{name}";r={max(capacity - used, 0)}')
    if not policies:
        return {}
    return {"RateLimit-Policy": ", ".join(policies), "RateLimit": ", ".join(states)}
