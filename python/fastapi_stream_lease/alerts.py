"""Threshold alerts: the app names fractions of a policy's limit (``alert_at=(0.8, 1.0)``) and
is told, through ``on_threshold``, when a hit or a stream start brings an identity's use of a
policy to one of them. Each (policy, identity, threshold) is told once per window: a fixed or
calendar window's until it ends, a sliding window's once per ``per`` seconds. What was told is
remembered in this process: another worker tells its own, once per window too."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .rates import PolicyEntry, RateDecision

# How many remembered alerts make a sweep of the expired ones worth its time.
SWEEP_AT = 1024


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


def checked_thresholds(alert_at: Sequence[float]) -> tuple[float, ...]:
    """``alert_at`` as fractions of a limit, each above 0 (1.0 is the limit itself)."""
    if isinstance(alert_at, (str, bytes)) or not isinstance(alert_at, Sequence):
        raise TypeError(
            f"alert_at must be a sequence of fractions such as (0.8, 1.0), got {alert_at!r}"
        )
    for threshold in alert_at:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise TypeError(f"alert_at holds fractions of a limit such as 0.8, got {threshold!r}")
        if not 0 < threshold < math.inf:
            raise ValueError(
                f"alert_at fractions must be above 0 (1.0 is the limit), got {threshold}"
            )
    return tuple(sorted(set(float(t) for t in alert_at)))


class ThresholdAlerts:
    """Which thresholds the decisions of one hit or start reached, each told once per window."""

    def __init__(self, thresholds: Sequence[float], digest: Callable[[str], str]) -> None:
        self.thresholds = checked_thresholds(thresholds)
        self._digest = digest
        #: (policy, identity hash, threshold) -> from which window end on it is told again.
        self._told: dict[tuple[str, str, float], float] = {}
        self._sweep_at = SWEEP_AT

    def reached(
        self, identities: Sequence[str], decisions: Sequence[RateDecision]
    ) -> list[ThresholdCrossed]:
        """The alerts due for ``decisions`` (a consuming hit's or start's, the i-th counted
        against ``identities[i]``)."""
        now = time.monotonic()
        due: list[ThresholdCrossed] = []
        for identity, decision in zip(identities, decisions, strict=True):
            limit = decision.policy.limit
            digest: str | None = None
            for threshold in self.thresholds:
                # Rounded so that 0.7 of 10 is 7 units, not 7.000000000000001.
                if decision.used < math.ceil(round(threshold * limit, 9)):
                    break
                digest = digest or self._digest(identity)
                key = (decision.policy.name, digest, threshold)
                ends, later_from = window_of(decision, now)
                if ends < self._told.get(key, -math.inf):
                    continue  # told in this window
                self._told[key] = later_from
                due.append(
                    ThresholdCrossed(
                        decision.policy.name,
                        threshold,
                        decision.used,
                        limit,
                        decision.reset,
                        digest,
                    )
                )
        if len(self._told) >= self._sweep_at:
            self._told = {key: later for key, later in self._told.items() if later > now}
            self._sweep_at = max(SWEEP_AT, 2 * len(self._told))
        return due


def window_of(decision: RateDecision, now: float) -> tuple[float, float]:
    """When the window of ``decision`` ends (monotonic seconds), and from which end on a
    window is a later one. A fixed or calendar window ends at ``now + reset``; the next one
    ends at least ``per`` later, so half of that absorbs the jitter of the round trip in
    ``now``. A sliding window never ends: it counts as a new one ``per`` seconds on."""
    policy = decision.policy
    if policy.algorithm == "sliding_window":
        return now + policy.per, now + 2 * policy.per
    ends = now + decision.reset
    return ends, ends + policy.per / 2


def identities_of(identity: str, policies: Sequence[PolicyEntry]) -> list[str]:
    """The identity each policy of a hit or a start counts: its own when paired with one,
    else ``identity``."""
    return [policy[1] if isinstance(policy, tuple) else identity for policy in policies]
