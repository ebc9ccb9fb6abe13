"""Named resources and the Limiter: fastapi-concurrency-limiter's API, distributed."""

from __future__ import annotations

import asyncio
import threading

import pytest
from fastapi import Depends, FastAPI
from starlette.testclient import TestClient

from fastapi_stream_lease import Limiter, Resource, StreamLeaseManager, StreamLeaseRejected

from support.waiting import wait_until


def test_the_seed_readme_example_as_written():
    from fastapi_concurrency_limiter_seed import build_app

    app, release, limiter = build_app()
    with TestClient(app) as client:
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(client.get("/messages").status_code))
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        # Two handlers hold the database (capacity 2); the third request waits, then gets 503.
        wait_until(lambda: limiter.manager.stats()["held"] == 2, what="both slots to be taken")
        busy = client.get("/messages")
        assert busy.status_code == 503
        assert busy.json() == {"detail": "Server busy, please retry later"}
        assert "retry-after" in busy.headers
        release.set()
        for thread in threads:
            thread.join(10)
        assert sorted(results) == [200, 200, 503]
        assert client.get("/file").status_code == 200
        assert client.get("/messages-and-file").status_code == 200
        assert client.get("/file-and-messages").status_code == 200  # any order: atomic


async def test_resources_cap_concurrency_and_take_several_atomically(make_manager):
    manager = make_manager(max_per_user=0, max_global=0)
    db, fs = Resource(2, "db"), Resource(1, "fs")
    inside = {"db": 0, "fs": 0}
    peak = {"db": 0, "fs": 0}

    async def use(resources: list[Resource]) -> None:
        lease = await manager.acquire(None, resources=resources, wait_timeout=30)
        for r in resources:
            inside[r.name] += 1
            peak[r.name] = max(peak[r.name], inside[r.name])
        await asyncio.sleep(0.002)
        for r in resources:
            inside[r.name] -= 1
        await lease.release()

    # Half take db then fs, half fs then db: an atomic acquire cannot deadlock.
    jobs = [use([db, fs] if i % 2 else [fs, db]) for i in range(60)]
    jobs += [use([db]) for _ in range(30)]
    await asyncio.wait_for(asyncio.gather(*jobs), 60)
    assert peak == {"db": 2, "fs": 1}


async def test_a_full_resource_refuses_with_its_name_and_503(make_manager):
    manager = make_manager()
    gpu = Resource(1, "gpu")
    held = await manager.acquire(None, resources=[gpu])
    with pytest.raises(StreamLeaseRejected) as refused:
        await manager.acquire("alice", resources=[gpu])
    assert refused.value.limit == "gpu" and refused.value.status_code == 503
    assert await manager.get_active_count("alice") == 0, "all or nothing"
    await held.release()


def test_bad_resources_and_registration_errors():
    with pytest.raises(ValueError, match="at least 1"):
        Resource(0)
    with pytest.raises(TypeError):
        Resource(True)
    db = Resource(3, "db")
    limiter = Limiter(resources=[db], timeout=1)
    with pytest.raises(ValueError, match="not registered"):
        limiter.resources([Resource(1, "other")])
    with pytest.raises(ValueError, match="names must be unique"):
        Limiter(resources=[Resource(1, "x"), Resource(2, "x")])


def test_depends_and_sync_endpoints(redis_server, key_prefix):
    from fastapi_stream_lease import LeaseConfig

    manager = StreamLeaseManager(url=redis_server.url, config=LeaseConfig(key_prefix=key_prefix))
    db = Resource(1, "db")
    limiter = Limiter(manager, resources=[db], timeout=0.2)
    app = FastAPI()

    @app.get("/sync")
    @limiter.resources([db])
    def sync_endpoint(q: int = 1) -> dict[str, int]:
        return {"q": q}

    @app.get("/dep", dependencies=[Depends(limiter.depends(db))])
    async def with_dependency() -> str:
        return "ok"

    with TestClient(app) as client:
        assert client.get("/sync", params={"q": 7}).json() == {"q": 7}  # signature intact
        assert client.get("/dep").json() == "ok"
