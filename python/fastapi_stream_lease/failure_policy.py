"""The 0.6 API's failure policy names. Here the circuit breaker is always on, with its own
timings (a failed call opens it; after a cool-down, one probe closes it again or reopens it
for longer), and what acquires do while Redis is down is ``LeaseConfig.failure_mode``:
``BackendFailurePolicy(fallback_mode=...)`` sets it, and ``manager.circuit_state`` reports the
breaker."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from math import isfinite


class CircuitState(str, Enum):
    """The breaker in front of Redis (``StreamLeaseManager.circuit_state``): ``CLOSED`` while
    calls go through, ``OPEN`` while they are refused at once. ``HALF_OPEN`` (one probe out)
    is reported as ``OPEN``: new acquires are still refused then."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class FallbackMode(str, Enum):
    """What acquires do while Redis is unreachable: ``FAIL_CLOSED`` refuses them (503,
    ``failure_mode="closed"``); ``FAIL_OPEN`` admits them against this process's share of the
    caps (``failure_mode="open"``, ``fallback_workers``), never unthrottled."""

    FAIL_CLOSED = "fail_closed"
    FAIL_OPEN = "fail_open"


@dataclass(frozen=True)
class CircuitBreakerConfig:
    """The 0.6 breaker's tuning, checked as 0.6 checked it and otherwise not used: this
    package's breaker times itself (see the module's docstring)."""

    failure_threshold: int = 5
    recovery_timeout: float = 10.0
    jitter: float = 1.0
    half_open_max_probes: int = 1

    def __post_init__(self) -> None:
        for name in ("failure_threshold", "half_open_max_probes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int of at least 1, got {value!r}")
        for name, low in (("recovery_timeout", 0.0), ("jitter", 0.0)):
            value = getattr(self, name)
            valid = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not valid or not isfinite(value) or value < low:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True)
class BackendFailurePolicy:
    """``LeaseConfig(failure_policy=...)``: its ``fallback_mode`` becomes
    ``LeaseConfig.failure_mode``; ``circuit_breaker`` is accepted and checked, not used."""

    circuit_breaker: CircuitBreakerConfig | None = None
    fallback_mode: FallbackMode = FallbackMode.FAIL_CLOSED

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "fallback_mode", FallbackMode(self.fallback_mode))
        except ValueError:
            allowed = [mode.value for mode in FallbackMode]
            raise ValueError(
                f"fallback_mode must be one of {allowed}, got {self.fallback_mode!r}"
            ) from None
        breaker = self.circuit_breaker
        if breaker is not None and not isinstance(breaker, CircuitBreakerConfig):
            raise TypeError(
                f"circuit_breaker must be a CircuitBreakerConfig or None, got "
                f"{type(breaker).__name__}"
            )
