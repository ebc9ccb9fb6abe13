"""Whether this process is one of several worker processes of one server: the embedded store
counts in one process, so under several workers each would enforce the caps on its own."""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

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
