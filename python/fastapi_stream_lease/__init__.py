"""Distributed, self-expiring concurrency leases for streaming endpoints (SSE, LLM token
streams, WebSockets) in FastAPI and Starlette, with a Rust core.
"""

from ._core import TOP_UP_INCREMENT, LeaseConfig, __version__
from .alerts import ThresholdCrossed
from .client_ip import client_ip
from .errors import (
    BackendError,
    BackendUnavailable,
    BudgetExhausted,
    ClientDisconnected,
    ConfigurationMismatchError,
    LeaseLost,
    LeaseRevoked,
    LineFull,
    ManagerClosed,
    PoolFull,
    RateLimited,
    ReservationTooLarge,
    StreamLeaseError,
    StreamLeaseLost,
    StreamLeaseRejected,
    StreamLeaseUnavailable,
    StreamLeaseWarning,
    UserBanned,
)
from .failure_policy import BackendFailurePolicy, CircuitBreakerConfig, CircuitState, FallbackMode
from .handlers import (
    install_exception_handler,
    register_exception_handlers,
    stream_lease_exception_handler,
)
from .lease import Lease, ProtectedStreamingResponse, StreamLease
from .limiter import Limiter
from .manager import LeaseScope, StreamLeaseManager
from .rates import (
    Prices,
    RateDecision,
    RateLimit,
    openai_rate_limit_headers,
    rate_limit_headers,
)
from .resources import Resource
from .stream_end import StreamEndMiddleware
from .web import RateLimitHeaders, RateLimitMiddleware

__all__ = [
    "TOP_UP_INCREMENT",
    "BackendError",
    "BackendFailurePolicy",
    "BackendUnavailable",
    "BudgetExhausted",
    "CircuitBreakerConfig",
    "CircuitState",
    "ClientDisconnected",
    "ConfigurationMismatchError",
    "FallbackMode",
    "Lease",
    "LeaseConfig",
    "LeaseLost",
    "LeaseRevoked",
    "LeaseScope",
    "Limiter",
    "LineFull",
    "ManagerClosed",
    "PoolFull",
    "Prices",
    "ProtectedStreamingResponse",
    "RateDecision",
    "RateLimit",
    "RateLimitHeaders",
    "RateLimitMiddleware",
    "RateLimited",
    "ReservationTooLarge",
    "Resource",
    "StreamEndMiddleware",
    "StreamLease",
    "StreamLeaseError",
    "StreamLeaseLost",
    "StreamLeaseManager",
    "StreamLeaseRejected",
    "StreamLeaseUnavailable",
    "StreamLeaseWarning",
    "ThresholdCrossed",
    "UserBanned",
    "__version__",
    "client_ip",
    "install_exception_handler",
    "openai_rate_limit_headers",
    "rate_limit_headers",
    "register_exception_handlers",
    "stream_lease_exception_handler",
]
