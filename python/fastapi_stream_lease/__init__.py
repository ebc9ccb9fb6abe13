"""Distributed, self-expiring concurrency leases for streaming endpoints (SSE, LLM token
streams, WebSockets) in FastAPI and Starlette, with a Rust core.
"""

from ._core import TOP_UP_INCREMENT, LeaseConfig, __version__
from .client_ip import client_ip
from .errors import (
    BackendError,
    BackendUnavailable,
    BudgetExhausted,
    ClientDisconnected,
    LeaseLost,
    LeaseRevoked,
    LineFull,
    ManagerClosed,
    PoolFull,
    RateLimited,
    StreamLeaseError,
    StreamLeaseRejected,
    StreamLeaseWarning,
    UserBanned,
)
from .handlers import install_exception_handler, stream_lease_exception_handler
from .lease import Lease
from .limiter import Limiter
from .manager import LeaseScope, StreamLeaseManager
from .rates import RateDecision, RateLimit, openai_rate_limit_headers, rate_limit_headers
from .resources import Resource
from .web import RateLimitHeaders, RateLimitMiddleware

__all__ = [
    "TOP_UP_INCREMENT",
    "BackendError",
    "BackendUnavailable",
    "BudgetExhausted",
    "ClientDisconnected",
    "Lease",
    "LeaseConfig",
    "LeaseLost",
    "LeaseRevoked",
    "LeaseScope",
    "Limiter",
    "LineFull",
    "ManagerClosed",
    "PoolFull",
    "RateDecision",
    "RateLimit",
    "RateLimitHeaders",
    "RateLimitMiddleware",
    "RateLimited",
    "Resource",
    "StreamLeaseError",
    "StreamLeaseManager",
    "StreamLeaseRejected",
    "StreamLeaseWarning",
    "UserBanned",
    "__version__",
    "client_ip",
    "install_exception_handler",
    "openai_rate_limit_headers",
    "rate_limit_headers",
    "stream_lease_exception_handler",
]
