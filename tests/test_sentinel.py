"""Behind Redis Sentinel: the core follows the master through a real failover."""

from __future__ import annotations

from urllib.parse import quote

import pytest
import redis.asyncio as redis_asyncio
from redis.asyncio.sentinel import Sentinel

from fastapi_stream_lease import (
    BackendError,
    LeaseConfig,
    StreamLeaseManager,
    StreamLeaseRejected,
)

from support.redis_servers import SentinelSetup
from support.waiting import eventually


@pytest.fixture
def sentinel_setup(tmp_path):
    setup = SentinelSetup(tmp_path).start()
    yield setup
    setup.cleanup()


async def test_a_sentinel_failover_is_survived(sentinel_setup, key_prefix):
    config = LeaseConfig(key_prefix=key_prefix, max_per_user=1, lease_seconds=2,
                         redis_timeout=0.5)
    manager = StreamLeaseManager(url=sentinel_setup.url, config=config)
    lease = await manager.acquire("alice")
    with pytest.raises(StreamLeaseRejected):
        await manager.acquire("alice")
    old_master = sentinel_setup.master_port()

    sentinel_setup.master.stop()  # the master dies; the sentinel promotes the replica

    async def new_master_serves() -> bool:
        if sentinel_setup.master_port() == old_master:
            return False
        try:
            count = await manager.get_active_count("alice")
        except BackendError:
            return False
        return count in (0, 1)

    await eventually(new_master_serves, timeout=30, what="the failover and a working connection")
    # The lease was replicated (it is still held) or was not (it is reported lost): no crash.
    async def settled() -> bool:
        return lease.lost or await manager.get_active_count("alice") == 1

    await eventually(settled, what="the lease to be renewed on the new master or reported lost")
    await lease.release()
    fresh = await manager.acquire("alice")  # the new master has an empty script cache: NOSCRIPT
    await fresh.release()
    await manager.aclose()


async def test_a_redis_py_sentinel_client_is_followed(sentinel_setup, key_prefix):
    sentinel = Sentinel([("127.0.0.1", sentinel_setup.sentinel_port)])
    client = sentinel.master_for("lease-master")
    manager = StreamLeaseManager(redis=client, config=LeaseConfig(key_prefix=key_prefix))
    assert manager.backend == sentinel_setup.url + "/0"
    lease = await manager.acquire("alice")
    direct = redis_asyncio.Redis(port=sentinel_setup.master_port())
    assert await direct.zcard(f"{{{key_prefix}}}:global") == 1
    await lease.release()
    await manager.aclose()
    await direct.aclose()
    await client.aclose()


async def leases_through(url: str, sentinel: Sentinel, password: str, key_prefix: str) -> None:
    """A lease through ``url``, then through a redis-py client of ``sentinel``'s master: both
    reach the master with the credentials they carry."""
    manager = StreamLeaseManager(url=url, config=LeaseConfig(key_prefix=key_prefix))
    assert "@" not in manager.backend.replace("***@", "")
    lease = await manager.acquire("alice")
    assert await manager.get_active_count("alice") == 1
    await lease.release()
    await manager.aclose()
    client = sentinel.master_for("lease-master", password=password)
    followed = StreamLeaseManager(redis=client, config=LeaseConfig(key_prefix=key_prefix))
    lease = await followed.acquire("alice")
    assert await client.zcard(f"{{{key_prefix}}}:global") == 1
    await lease.release()
    await followed.aclose()
    await client.aclose()


async def test_percent_encoded_credentials_authenticate_behind_sentinel(tmp_path, key_prefix):
    password = "p@ss:w/r%d?"
    setup = SentinelSetup(tmp_path, password=password).start()
    try:
        url = setup.url.replace("://", f"://default:{quote(password, safe='')}@")
        # A redis-py Sentinel client's password is carried over percent-encoded too.
        sentinel = Sentinel([("127.0.0.1", setup.sentinel_port)])
        await leases_through(url, sentinel, password, key_prefix)
    finally:
        setup.cleanup()


async def test_sentinels_that_require_their_own_password(tmp_path, key_prefix):
    password, sentinel_password = "master-pw", "s3nt/n@l:pw"
    setup = SentinelSetup(tmp_path, password=password, sentinel_password=sentinel_password).start()
    try:
        url = (setup.url.replace("://", f"://:{password}@")
               + f"?sentinel_password={quote(sentinel_password, safe='')}")
        # A redis-py Sentinel client's sentinel password is carried over too.
        sentinel = Sentinel([("127.0.0.1", setup.sentinel_port)],
                            sentinel_kwargs={"password": sentinel_password})
        await leases_through(url, sentinel, password, key_prefix)
    finally:
        setup.cleanup()
