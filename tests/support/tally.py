"""A holder's tally in Redis (``<tag>:holders:<id>:members``): its count of members and the sum
of their ids in one integer, each member adding ``TALLY_UNIT`` and its id's value, as
``lua/prelude/holders.lua`` keeps it."""

from __future__ import annotations

import redis as redis_py

TALLY_UNIT = 2**44


def id_value(lease_id: str) -> int:
    """What one member of the lease adds to its holder's sum of ids."""
    return int(lease_id[:6], 16)


def counted(client: redis_py.Redis, key: str) -> int:
    """The members a holder's tally counts."""
    return (int(client.get(key) or 0) + TALLY_UNIT // 2) // TALLY_UNIT


def take_out(client: redis_py.Redis, key: str, lease_id: str, members: int) -> None:
    """Takes ``members`` of the lease out of the tally, as a write lost in a failover would."""
    client.incrby(key, -members * (TALLY_UNIT + id_value(lease_id)))
