"""Where the backend is, when the code names none: the deployment's environment, as twelve-factor
apps are configured. The app's manager and the command line read the same variables."""

from __future__ import annotations

import logging
import os

#: The backend's URL (any URL ``StreamLeaseManager(url=...)`` takes).
URL_VARIABLE = "STREAM_LEASE_URL"
#: Read when ``STREAM_LEASE_URL`` is unset: the name most hosts give their Redis.
FALLBACK_URL_VARIABLE = "REDIS_URL"
#: The identity secret, when ``LeaseConfig(identity_secret=)`` is not given (the core reads it).
SECRET_VARIABLE = "STREAM_LEASE_IDENTITY_SECRET"

log = logging.getLogger("fastapi_stream_lease")


def backend_url_from_environment() -> tuple[str, str] | None:
    """``(url, the variable it came from)``: ``STREAM_LEASE_URL``, else ``REDIS_URL``; None when
    neither is set (an empty value counts as unset)."""
    for variable in (URL_VARIABLE, FALLBACK_URL_VARIABLE):
        url = os.environ.get(variable, "").strip()
        if url:
            return url, variable
    return None


def named_in_errors(variable: str, error: ValueError) -> ValueError:
    """``error`` (a URL the manager refused) saying which variable held the URL."""
    return ValueError(f"${variable}: {error} (fix or unset {variable})")


_fallback_said = False


def say_fallback_once(backend: str) -> None:
    """Logs, once per process, that the manager runs on ``$REDIS_URL`` (``backend``: the URL
    without its password) because ``$STREAM_LEASE_URL`` is unset."""
    global _fallback_said
    if not _fallback_said:
        _fallback_said = True
        log.info(
            "%s is unset: the manager uses $%s, %s", URL_VARIABLE, FALLBACK_URL_VARIABLE, backend
        )
