"""The 0.6 API's module of errors, for code that imports them from here: the same classes as
:mod:`fastapi_stream_lease` exports (see :mod:`fastapi_stream_lease.errors`)."""

from .errors import (
    ConfigurationMismatchError,
    StreamLeaseError,
    StreamLeaseLost,
    StreamLeaseRejected,
    StreamLeaseUnavailable,
)
from .handlers import register_exception_handlers

__all__ = [
    "ConfigurationMismatchError",
    "StreamLeaseError",
    "StreamLeaseLost",
    "StreamLeaseRejected",
    "StreamLeaseUnavailable",
    "register_exception_handlers",
]
