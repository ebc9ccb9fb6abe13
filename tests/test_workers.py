"""Several worker processes share one cap; a worker killed with SIGKILL frees its slots by
expiry without touching the others'; a worker stalled past its leases loses them to others and
never pushes a pool past its cap; a worker shut down by SIGTERM releases at once. Under real
uvicorn and gunicorn servers with several workers: SIGTERM drains every worker through the
manager's lifespan, and the embedded store, which counts in one process, warns in each."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
import warnings
from pathlib import Path

import pytest
import uvicorn

from fastapi_stream_lease import (
    LeaseConfig,
    StreamLeaseManager,
    StreamLeaseRejected,
    StreamLeaseWarning,
)

from support.apps import APPS_DIR, app_command
from support.ports import free_port
from support.waiting import count_is, eventually, wait_until


async def start_worker(url: str, prefix: str, name: str):
    worker = await asyncio.create_subprocess_exec(
        *app_command("holding_worker", url, prefix, name), stdout=asyncio.subprocess.PIPE
    )
    line = await asyncio.wait_for(worker.stdout.readline(), 30)
    assert line.startswith(b"held"), line
    return worker, line.split()[1:]


async def test_a_killed_worker_frees_its_slots_and_no_one_elses(redis_server, redis_client,
                                                               key_prefix, make_redis_manager):
    observer = make_redis_manager(max_per_user=0, max_global=4, lease_seconds=1)
    doomed, _ = await start_worker(redis_server.url, key_prefix, "a")
    survivor, survivor_ids = await start_worker(redis_server.url, key_prefix, "b")
    assert await observer.get_active_count() == 4
    with pytest.raises(StreamLeaseRejected):
        await observer.acquire("c")  # the two workers share one cap

    doomed.send_signal(signal.SIGKILL)
    await doomed.wait()
    await count_is(observer, 2)  # within lease_seconds (+ one renewal period)
    await asyncio.sleep(2.5)  # more than two lease periods: the survivor keeps renewing
    # The dead worker's members are gone (reaped), the survivor's all there.
    alive = redis_client.zrange(f"{{{key_prefix}}}:global", 0, -1)
    assert set(alive) == set(survivor_ids)
    lease = await observer.acquire("c")

    survivor.send_signal(signal.SIGTERM)  # graceful shutdown: releases in one round trip
    assert (await asyncio.wait_for(survivor.stdout.readline(), 30)).startswith(b"closed")
    assert await survivor.wait() == 0
    assert await observer.get_active_count() == 1
    await lease.release()


async def test_a_stalled_worker_loses_its_slots_and_the_cap_holds(redis_server, redis_client,
                                                                  key_prefix, make_redis_manager):
    observer = make_redis_manager(max_per_user=0, max_global=4, lease_seconds=1)
    stalled, _ = await start_worker(redis_server.url, key_prefix, "a")
    running, running_ids = await start_worker(redis_server.url, key_prefix, "b")
    stalled.send_signal(signal.SIGSTOP)  # a long pause: it renews nothing
    taken = []

    async def took_its_slots() -> bool:
        try:
            taken.append(await observer.acquire(f"c{len(taken)}"))
        except StreamLeaseRejected:
            pass
        return len(taken) == 2

    await eventually(took_its_slots, what="the stalled worker's slots to be reaped and taken")
    stalled.send_signal(signal.SIGCONT)

    async def stalled_lost_both() -> bool:
        stalled.send_signal(signal.SIGUSR1)
        line = await asyncio.wait_for(stalled.stdout.readline(), 30)
        return line.split() == [b"lost", b"2"]

    await eventually(stalled_lost_both, what="the resumed worker to find its leases lost")
    members = set(redis_client.zrange(f"{{{key_prefix}}}:global", 0, -1))
    assert members == set(running_ids) | {lease.lease_id.encode() for lease in taken}
    for worker in (stalled, running):
        worker.send_signal(signal.SIGTERM)
        assert await worker.wait() == 0


APP_ON_THE_DEFAULT_STORE = """
from fastapi import FastAPI

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

manager = StreamLeaseManager(config=LeaseConfig(max_per_user=2))
app = FastAPI()
"""


def load_as_uvicorn_does(tmp_path, monkeypatch, code: str, **settings) -> Path:
    """Imports ``code`` as an app module through uvicorn's own loader (``Config.load``), as each
    worker process of ``uvicorn app:app`` does; returns the module's path."""
    name = f"app_{uuid.uuid4().hex[:12]}"
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    uvicorn.Config(f"{name}:app", log_config=None, **settings).load()
    return path


def test_the_default_embedded_store_under_several_uvicorn_workers_warns_naming_the_fix(
    tmp_path, monkeypatch
):
    """Without a URL the manager uses the embedded store, which counts in one process: under
    ``uvicorn --workers 3`` a user held 3 streams against a cap of 2, with no word said."""
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    with pytest.warns(StreamLeaseWarning) as seen:
        path = load_as_uvicorn_does(tmp_path, monkeypatch, APP_ON_THE_DEFAULT_STORE, workers=3)
    (warning,) = seen
    assert str(warning.message).startswith(
        "no url= or redis= given, so the embedded store (memory://) keeps the leases, in this "
        "process alone, but uvicorn runs 3 worker processes (--workers 3): each counts its own "
        "streams against max_per_user and max_global, so a user can hold 3 times the cap. "
        "Pass url='redis://host:6379/0' (or redis=<client>)"
    )
    assert warning.filename == str(path), "points at the line that built the manager"


def test_web_concurrency_warns_where_no_server_tells_its_workers(tmp_path, monkeypatch):
    """uvicorn and gunicorn both take WEB_CONCURRENCY as their worker count by default."""
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    with pytest.warns(StreamLeaseWarning, match=r"--workers 4"):
        load_as_uvicorn_does(tmp_path, monkeypatch, APP_ON_THE_DEFAULT_STORE)
    with pytest.warns(StreamLeaseWarning, match=r"memory:// keeps the leases.* WEB_CONCURRENCY=4"):
        StreamLeaseManager(url="memory://")


def test_one_worker_or_redis_under_several_warns_of_nothing(redis_server, tmp_path, monkeypatch):
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    on_redis = APP_ON_THE_DEFAULT_STORE.replace("(config=", f"(url={redis_server.url!r}, config=")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_as_uvicorn_does(tmp_path, monkeypatch, APP_ON_THE_DEFAULT_STORE, workers=1)
        load_as_uvicorn_does(tmp_path, monkeypatch, APP_ON_THE_DEFAULT_STORE, reload=True)
        with pytest.warns(StreamLeaseWarning, match="no identity_secret"):
            load_as_uvicorn_does(tmp_path, monkeypatch, on_redis, workers=2)


def test_fail_open_with_fewer_fallback_workers_than_workers_warns_naming_the_fleet_bound(
    redis_server, monkeypatch
):
    """Regression: ``fail_open=True`` with the default ``fallback_workers=1`` admitted 18
    streams against ``max_global=6`` on three workers while Redis was down, with no warning."""
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    config = LeaseConfig(
        fail_open=True, max_per_user=2, max_global=6, identity_secret="x" * 32
    )
    with pytest.warns(StreamLeaseWarning) as seen:
        StreamLeaseManager(url=redis_server.url, config=config)
    (warning,) = seen
    assert "the fleet may admit 3 times each cap (max_per_user=2: up to 6, max_global=6: up to " \
        "18). Set fallback_workers to the worker processes of every machine" in str(warning.message)
    right = LeaseConfig(
        fail_open=True, max_per_user=3, max_global=6, fallback_workers=3, identity_secret="x" * 32
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StreamLeaseManager(url=redis_server.url, config=right)


def test_fail_open_with_a_cap_below_fallback_workers_warns_that_it_admits_nothing(redis_server):
    """Regression: with ``fallback_workers=3`` a ``max_per_user=2`` has a share of 0, so fail
    open admitted nothing at all while Redis was down, with no warning."""
    config = LeaseConfig(
        fail_open=True, max_per_user=2, fallback_workers=3, identity_secret="x" * 32
    )
    with pytest.warns(StreamLeaseWarning, match=r"the share of max_per_user=2 is 0, so while "
                      r"Redis is down nothing is admitted under it"):
        StreamLeaseManager(url=redis_server.url, config=config)


# What each worker logs once it serves, and what the server logs when its graceful timeout runs
# out with requests still running.
SERVING = {"uvicorn": "Application startup complete", "gunicorn": "ASGI server listening on"}
GAVE_UP = {"uvicorn": "timeout graceful shutdown exceeded", "gunicorn": "after timeout"}


class Server:
    """``uvicorn --workers 2`` or ``gunicorn --workers 2`` (its own ASGI worker class) serving
    ``tests/apps/<app>.py`` on a free port, its log read as it comes."""

    def __init__(self, kind: str, app: str, env: dict[str, str], graceful_timeout: int) -> None:
        self.kind = kind
        self.port = free_port()
        if kind == "uvicorn":
            command = ["uvicorn", f"{app}:app", "--app-dir", str(APPS_DIR),
                       "--port", str(self.port), "--workers", "2",
                       "--timeout-graceful-shutdown", str(graceful_timeout)]
        else:
            command = ["gunicorn", f"{app}:app", "--pythonpath", str(APPS_DIR),
                       "--bind", f"127.0.0.1:{self.port}", "--workers", "2", "--worker-class",
                       "asgi", "--graceful-timeout", str(graceful_timeout),
                       "--no-control-socket"]
        self.process = subprocess.Popen(
            [sys.executable, "-m", *command], env={**os.environ, **env},
            stderr=subprocess.PIPE, text=True,
        )
        self.log: list[str] = []
        self._reader = threading.Thread(target=lambda: self.log.extend(self.process.stderr))
        self._reader.start()

    def logged(self, text: str) -> int:
        return sum(text in line for line in self.log)

    def wait_until_serving(self) -> None:
        wait_until(lambda: self.logged(SERVING[self.kind]) == 2, timeout=60,
                   what=f"both {self.kind} workers to serve")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join()
        self.process.stderr.close()


@pytest.fixture(params=["uvicorn", "gunicorn"])
def server_kind(request: pytest.FixtureRequest) -> str:
    return request.param


def test_each_worker_on_the_embedded_store_warns_once(server_kind, key_prefix):
    server = Server(server_kind, "slow_stream_app",
                    {"STREAM_LEASE_URL": "memory://", "STREAM_LEASE_PREFIX": key_prefix}, 1)
    try:
        wait_until(lambda: server.logged("StreamLeaseWarning") == 2, timeout=60,
                   what="both workers to warn")
        server.wait_until_serving()
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)
        server.stop()
    warned = [line for line in server.log if "StreamLeaseWarning" in line]
    assert len(warned) == 2, warned
    for line in warned:
        assert f"memory:// keeps the leases, in this process alone, but {server_kind} runs 2 " \
            "worker processes (--workers 2)" in line


def start_stream(port: int, query: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    request = f"GET /stream?{query} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    sock.sendall(request.encode())
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended before {marker!r}: {data!r}"
        data += chunk
    return data


def read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def test_sigterm_drains_every_worker_before_the_server_stops(
    server_kind, redis_server, key_prefix
):
    """uvicorn and gunicorn run the lifespan's shutdown only once every connection has closed,
    so a drain there came after the streams it should have waited for; the lifespan starts it
    at SIGTERM instead: a request waiting in line gets 503 at once, a stream that ends within
    the drain's timeout runs to its end, one that would not is ended as revoked before the
    server's own graceful timeout, and every slot is released, not left to expire."""
    server = Server(server_kind, "draining_streams", {
        "STREAM_LEASE_URL": redis_server.url, "STREAM_LEASE_PREFIX": key_prefix,
        "DRAIN_TIMEOUT": "3",
    }, graceful_timeout=60)
    try:
        server.wait_until_serving()
        finishing = start_stream(server.port, "user_id=a&ticks=20")
        endless = start_stream(server.port, "user_id=b")
        for sock in (finishing, endless):
            read_until(sock, b"data: tick 0")
        waiting = start_stream(server.port, "user_id=c&wait=60")  # the global cap is 2: in line
        wait_until(lambda: int(redis_server.cli("zcard", f"{{{key_prefix}}}:global|line")) == 1,
                   what="the third stream to wait in line")

        server.process.send_signal(signal.SIGTERM)

        refused = read_to_end(waiting)
        assert refused.startswith(b"HTTP/1.1 503"), refused
        assert b"retry-after: " in refused.lower()
        late = start_stream(server.port, "user_id=d")  # after SIGTERM: 503, or never answered
        try:
            answer = read_to_end(late)
        except ConnectionResetError:
            answer = b""
        assert answer == b"" or answer.startswith(b"HTTP/1.1 503"), answer
        finished = read_to_end(finishing)
        assert b"data: tick 19\n\n" in finished and finished.endswith(b"0\r\n\r\n"), finished
        read_to_end(endless)  # ended by the drain's revocation
        assert server.process.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        server.stop()
    # Released by the drain, not by expiry: the leases had 30 s left.
    assert int(redis_server.cli("zcard", f"{{{key_prefix}}}:global")) == 0
    assert not server.logged(GAVE_UP[server_kind]), server.log
