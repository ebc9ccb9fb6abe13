"""Threshold alerts: the app names fractions of a policy's limit (``alert_at=(0.8, 1.0)``, for
every policy on the manager or for one on its ``RateLimit``) and is told, through
``on_threshold``, when a hit or a stream start brings an identity's use of a policy to one of
them. Each (policy, identity, threshold) is told once per window across every
worker: the store decides, in the step that counts the hit or start, which decision reached a
threshold first (``RateDecision.thresholds_reached``); a fixed or calendar window's alert comes
again in the next window, a sliding window's once the units that reached it have left it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .rates import PolicyEntry, RateDecision


@dataclass(frozen=True)
class ThresholdCrossed:
    """A policy's use reached ``threshold`` (a fraction of ``limit``) for one identity:
    ``used`` units of ``limit`` in the window, which frees up in ``reset`` seconds.
    ``identity_hash`` is the identity's keyed hash (``LeaseConfig.identity_secret``), the one
    the Redis keys and the logs carry, never the identity itself."""

    policy: str
    threshold: float
    used: int
    limit: int
    reset: float
    identity_hash: str


def crossed(
    identities: Sequence[str], decisions: Sequence[RateDecision], digest: Callable[[str], str]
) -> list[ThresholdCrossed]:
    """The alerts of ``decisions`` (a consuming hit's or start's, the i-th counted against
    ``identities[i]``): one per threshold a decision reached first in its window."""
    return [
        ThresholdCrossed(
            decision.policy.name,
            threshold,
            decision.used,
            decision.policy.limit,
            decision.reset,
            digest(identity),
        )
        for identity, decision in zip(identities, decisions, strict=True)
        for threshold in decision.thresholds_reached
    ]


def identities_of(identity: str, policies: Sequence[PolicyEntry]) -> list[str]:
    """The identity each policy of a hit or a start counts: its own when paired with one,
    else ``identity``."""
    return [policy[1] if isinstance(policy, tuple) else identity for policy in policies]
