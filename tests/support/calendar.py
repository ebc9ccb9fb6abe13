"""Calendar windows' boundaries by Python's own calendar, and the clock a store's windows
follow, to compute what a calendar window's reset must be."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import redis as redis_py

DAY, WEEK, MONTH = 0, 1, 2
#: A window's reset read later in its life: the embedded store counts it down on its monotonic
#: clock in whole ms from the wall-clock time it started, so it may read 1 ms short.
COUNTDOWN_SLACK_MS = 1


def clock_ms(backend_url: str) -> int:
    """The clock a store's windows follow, in ms since 1970 UTC: the Redis server's TIME, or
    this machine's for the embedded store."""
    if backend_url == "memory://":
        return time.time_ns() // 1_000_000
    with redis_py.Redis.from_url(backend_url) as client:
        seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def boundaries(unix_ms: int) -> list[int]:
    """The next midnight, Monday midnight and 1st-of-month midnight after ``unix_ms`` (UTC), in
    ms since 1970 (indexed by DAY, WEEK, MONTH)."""
    moment = datetime.fromtimestamp(unix_ms / 1000, tz=timezone.utc)
    midnight = datetime(moment.year, moment.month, moment.day, tzinfo=timezone.utc)
    day = midnight + timedelta(days=1)
    week = midnight + timedelta(days=7 - midnight.weekday())
    month = datetime(
        moment.year + moment.month // 12, moment.month % 12 + 1, 1, tzinfo=timezone.utc
    )
    return [int(end.timestamp() * 1000) for end in (day, week, month)]
