"""Whether this process is one of several worker processes of one server: the embedded store
counts in one process, so under several workers each would enforce the caps on its own; and
under ``failure_mode="open"`` each worker admits its share of every cap while Redis is down,
so ``fallback_workers`` below the workers multiplies the caps."""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType
from typing import Any

from .errors import StreamLeaseWarning

# The worker count uvicorn and gunicorn take when ``--workers`` is not given.
WORKERS_VARIABLE = "WEB_CONCURRENCY"


def several_workers() -> tuple[int, str] | None:
    """How many worker processes serve this app and what says so, or None for one (or no
    telling): the server that is importing the app, as each of its workers does (uvicorn's
    ``Config.load``, gunicorn's worker or, with ``--preload``, its arbiter: both carry the
    configured count), else ``WEB_CONCURRENCY``."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        server = str(frame.f_globals.get("__name__", "")).partition(".")[0]
        if server in ("uvicorn", "gunicorn"):
            loader = frame.f_locals.get("self")
            if server == "uvicorn" and type(loader).__name__ == "Config":
                if getattr(loader, "reload", False):
                    return None  # one worker, restarted on changes
                return _told(server, getattr(loader, "workers", None))
            settings = getattr(loader, "cfg", None)
            if server == "gunicorn" and settings is not None:
                return _told(server, getattr(settings, "workers", None))
        frame = frame.f_back
    concurrency = os.environ.get(WORKERS_VARIABLE, "")
    if concurrency.isdigit() and int(concurrency) > 1:
        workers = int(concurrency)
        return workers, f"{WORKERS_VARIABLE}={concurrency} asks the server for {workers} workers"
    return None


def _told(server: str, workers: object) -> tuple[int, str] | None:
    if isinstance(workers, int) and workers > 1:
        return workers, f"{server} runs {workers} worker processes (--workers {workers})"
    return None


def warn_if_several_workers(defaulted: bool) -> None:
    """Warns the line that built an embedded-store manager (two frames up) when this process is
    one of several workers; ``defaulted``: no URL nor client was given."""
    found = several_workers()
    if found is None:
        return
    workers, evidence = found
    store = (
        "no url= or redis= given, so the embedded store (memory://)" if defaulted else "memory://"
    )
    warnings.warn(
        f"{store} keeps the leases, in this process alone, but {evidence}: each counts its own "
        "streams against max_per_user and max_global, so a user can hold "
        f"{workers} times the cap. Pass url='redis://host:6379/0' (or redis=<client>) so that "
        "every worker counts in one place, or run one worker process.",
        StreamLeaseWarning,
        stacklevel=3,
    )


def warn_about_the_local_floor(config: Any) -> None:
    """Warns the line that built a manager under ``failure_mode="open"`` (two frames up) when,
    while Redis is down, its caps would not hold across the fleet: ``fallback_workers`` below
    the worker processes this server runs (each admits up to ``cap / fallback_workers``), or a
    cap below ``fallback_workers`` (its share is 0: nothing is admitted under it, as under
    ``"closed"``)."""
    workers = config.fallback_workers
    caps = {"max_per_user": config.max_per_user, "max_global": config.max_global}
    found = several_workers()
    if found is not None and found[0] > workers:
        running, evidence = found
        bounds = ", ".join(
            f"{name}={cap}: up to {cap // workers * running}" for name, cap in caps.items() if cap
        )
        warnings.warn(
            f"failure_mode='open' with fallback_workers={workers}, but {evidence}: while "
            f"Redis is down each admits up to cap / fallback_workers of every cap, so the "
            f"fleet may admit {running / workers:g} times each cap ({bounds}). Set "
            f"fallback_workers to the worker processes of every machine that serves this app "
            f"(at least {running}).",
            StreamLeaseWarning,
            stacklevel=3,
        )
    zero = [f"{name}={cap}" for name, cap in caps.items() if 0 < cap < workers]
    if zero:
        warnings.warn(
            f"failure_mode='open' with fallback_workers={workers}: the share of "
            f"{' and '.join(zero)} is 0, so while Redis is down nothing is admitted under it "
            "(the shares round down so that all the workers' add up to at most the cap); "
            "raise the cap or lower fallback_workers if that is not what you want.",
            StreamLeaseWarning,
            stacklevel=3,
        )
