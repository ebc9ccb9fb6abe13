"""On a real 3-master Redis Cluster: no CROSSSLOT, caps hold, clients of both kinds work."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager, StreamLeaseRejected


async def test_caps_hold_on_a_cluster(redis_cluster, key_prefix):
    config = LeaseConfig(key_prefix=key_prefix, max_per_user=2, max_global=5, lease_seconds=1)
    managers = [StreamLeaseManager(url=redis_cluster.url, config=config) for _ in range(3)]
    results = await asyncio.gather(
        *(managers[i % 3].acquire(f"user{i % 4}") for i in range(40)), return_exceptions=True
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    assert all(isinstance(r, StreamLeaseRejected) for r in results if r not in granted)
    assert len(granted) == 5
    await asyncio.sleep(1.5)  # renewal batches run on the cluster too
    assert await managers[0].get_active_count() == 5
    assert not any(lease.lost for lease in granted)
    for manager in managers:
        await manager.aclose()
    observer = StreamLeaseManager(url=redis_cluster.url, config=config)
    assert await observer.get_active_count() == 0
    await observer.aclose()


async def test_a_redis_asyncio_cluster_client_is_accepted(redis_cluster, key_prefix):
    first = redis_cluster.nodes[0]
    client = AsyncRedisCluster(host="127.0.0.1", port=first.port)
    manager = StreamLeaseManager(
        redis=client, config=LeaseConfig(key_prefix=key_prefix, max_per_user=1)
    )
    assert manager.backend.startswith("redis+cluster://")
    lease = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("alice")
    assert await client.zcard(f"{{{key_prefix}}}:global") == 1
    await lease.release()
    await manager.aclose()
    await client.aclose()
