"""The auditor's reads of Redis: the holders and the pools, with Redis' clock, by a script of
its own, each read atomic.

On one Redis, and on the cluster where every pool is in the shared tag, one read takes every
pool. Under ``lease_global_slots`` on the cluster each user's pool is in a tag of its own, on
whichever master serves its slot, and a script reads one tag: a round reads each tag on its
master, one call per tag, each stamped with its own times and Redis' clock (see ``Sample``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as redis_asyncio

from chaos.records import Sample
from chaos.settings import Settings
from chaos.targets import Cluster, SingleRedis

# Redis' clock, the holders (KEYS[1]), then each pool, in one atomic step.
SAMPLE_SCRIPT = """
local t = redis.call('TIME')
local out = {t[1], t[2], redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')}
for i = 2, #KEYS do
  out[#out + 1] = redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES')
end
return out
"""
now = time.monotonic


class Sampler:
    def __init__(self, settings: Settings, target: SingleRedis | Cluster) -> None:
        self.settings = settings
        self.target = target
        self.per_tag = settings.tags_per_user_on_cluster

    def ports(self) -> list[int]:
        """The nodes that hold the run's keys."""
        if not self.per_tag:
            return [self.target.node.port]
        return sorted({self.target.node_for(holders).port
                       for holders, _ in self.settings.tag_reads()})

    def faulted_tags(self) -> str:
        """Which tags the faults on the run's node reach (the global pool's, and the users'
        own that share its master)."""
        node = self.target.node
        users = [self.settings.pool_name(pools[0]).removeprefix("per_user:")
                 for holders, pools in self.settings.tag_reads()[1:]
                 if self.target.node_for(holders) is node]
        return (f"the global pool's tag and {len(users)} of {self.settings.users} users' own"
                + (f" ({', '.join(users)})" if users else ""))

    async def read(self) -> list[Sample]:
        """One round of reads; a node that does not answer is left out of it."""
        if not self.per_tag:
            sample = await self.read_all()
            return [] if sample is None else [sample]
        by_port: dict[int, list[tuple[str, list[str]]]] = {}
        for holders, pools in self.settings.tag_reads():
            by_port.setdefault(self.target.node_for(holders).port, []).append((holders, pools))
        # The masters side by side, so one stalled (its reads time out) delays no other's.
        rounds = await asyncio.gather(*(self.read_node(port, reads)
                                        for port, reads in by_port.items()))
        return [sample for samples in rounds for sample in samples]

    async def read_node(self, port: int, reads: list[tuple[str, list[str]]]) -> list[Sample]:
        """The tags one master holds, one call each."""
        samples = []
        client = _client(port)
        try:
            for holders, pools in reads:
                sample = await self.read_tag(client, holders, pools)
                if sample is None:
                    break  # the node is down or stalled: its other tags too
                samples.append(sample)
        finally:
            await client.aclose()
        return samples

    async def read_all(self) -> Sample | None:
        """Every pool, with the shared tag's holders and each user's own tag's, in one call."""
        own = self.settings.own_holders_keys()
        keys = [self.settings.holders_key, *self.settings.pools(), *own.values()]
        client = _client(self.target.node.port)
        try:
            read = await _read(client, keys)
        finally:
            await client.aclose()
        if read is None:
            return None
        r0, r1, now_ms, reply = read
        tables = [_holders(entries)
                  for entries in (reply[2], *reply[3 + len(keys) - 1 - len(own):])]
        pools = _pools(keys[1:len(keys) - len(own)], reply[3:])
        return Sample(r0, r1, now_ms, tables[0], pools, dict(zip(own, tables[1:], strict=True)))

    async def read_tag(self, client: redis_asyncio.Redis, holders: str,
                       pool_keys: list[str]) -> Sample | None:
        """One tag's holders and pools: the shared tag's as a sample's ``holders``, a user's
        own as its pool's ``own_holders``."""
        read = await _read(client, [holders, *pool_keys])
        if read is None:
            return None
        r0, r1, now_ms, reply = read
        table = _holders(reply[2])
        pools = _pools(pool_keys, reply[3:])
        if holders == self.settings.holders_key:
            return Sample(r0, r1, now_ms, table, pools, reads=frozenset(pool_keys))
        return Sample(r0, r1, now_ms, {}, pools, {key: table for key in pool_keys},
                      reads=frozenset(pool_keys))


async def _read(
    client: redis_asyncio.Redis, keys: list[str]
) -> tuple[float, float, int, list[Any]] | None:
    """The script's reply for ``keys`` with the times just before it was sent and just after it
    came, and Redis' clock in ms; None when the node did not answer."""
    try:
        r0 = now()
        reply = await client.eval(SAMPLE_SCRIPT, len(keys), *keys)
        r1 = now()
    except (redis_asyncio.RedisError, OSError):
        return None
    return r0, r1, int(reply[0]) * 1000 + int(reply[1]) // 1000, reply


def _client(port: int) -> redis_asyncio.Redis:
    return redis_asyncio.Redis(host="127.0.0.1", port=port, socket_timeout=1.0,
                               socket_connect_timeout=1.0)


def _holders(entries: list[bytes]) -> dict[int, int]:
    return {int(float(h)): int(float(e)) for h, e in _pairs(entries)}


def _pools(keys: list[str], replies: list[list[bytes]]) -> dict[str, list[tuple[str, int]]]:
    pools = {}
    for key, entries in zip(keys, replies, strict=False):
        if entries:
            pools[key] = [(m.decode(), int(float(h))) for m, h in _pairs(entries)]
    return pools


def _pairs(flat: list[bytes]) -> list[tuple[bytes, bytes]]:
    return list(zip(flat[::2], flat[1::2], strict=True))
