"""One chaos run: a Redis (or the cluster), the proxy, the workers, the fault schedule, the
samples of Redis, then the drain and the auditor's judgement."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import redis.asyncio as redis_asyncio

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

from chaos import targets
from chaos.auditor import Audit, Bounds, Violation, WorkerLife
from chaos.faults import CLUSTER_KINDS, KINDS, Fault, draw_schedule
from chaos.sampler import Sampler
from chaos.settings import Settings

TESTS_DIR = Path(__file__).resolve().parent.parent
SAMPLE_EVERY = 0.3
# How long a settlement's marker and a model's answer sizes live (settle.lua).
SETTLED_MS = 600_000
ANSWERS_MS = 7 * 86_400_000
RSS_EVERY = 2.0
now = time.monotonic


class Worker:
    def __init__(self, life: WorkerLife, process: asyncio.subprocess.Process,
                 reader: asyncio.Task[None]) -> None:
        self.life = life
        self.process = process
        self.reader = reader


class ChaosRun:
    def __init__(
        self, seed: int, seconds: float, cluster: bool = False, workers: int = 4,
        settings: Settings | None = None, bounds: Bounds | None = None,
        say: Callable[[str], None] = print, kinds: list[str] | None = None,
    ) -> None:
        self.seed = seed
        self.seconds = seconds
        self.cluster = cluster
        self.worker_count = workers
        # The workers' settings say where they run (the budget levels one call can take).
        self.settings = replace(settings or Settings(key_prefix=f"chaos{seed}"), cluster=cluster)
        self.bounds = bounds or Bounds.of(self.settings)
        self.say = say
        if kinds is None:
            kinds = CLUSTER_KINDS if cluster else list(KINDS)
        self.schedule = draw_schedule(
            seed, seconds, kinds, workers, self.settings.lease_seconds)
        self.workers: dict[int, Worker] = {}
        self.generation: Counter[int] = Counter()
        self.proxy: asyncio.subprocess.Process | None = None
        self.ports: list[int] = []
        self.stopping = False

    # -- setting up --

    async def run(self) -> Audit:
        target: targets.SingleRedis | targets.Cluster = (
            targets.Cluster(self.settings.tag) if self.cluster else targets.SingleRedis())
        self.target = target
        await asyncio.to_thread(target.start)
        self.sampler = Sampler(self.settings, target)
        try:
            return await self._run()
        finally:
            if self.proxy is not None and self.proxy.returncode is None:
                self.proxy.kill()
                await self.proxy.wait()
            for worker in self.workers.values():
                if worker.process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.process.pid, signal.SIGCONT)
                    worker.process.kill()
                    await worker.process.wait()
            await asyncio.to_thread(target.cleanup)

    async def _run(self) -> Audit:
        if not self.cluster:
            self.proxy = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "chaos.proxy", str(self.target.node.port),
                str(self.worker_count), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, env=self.env())
            assert self.proxy.stdout is not None
            line = (await asyncio.wait_for(self.proxy.stdout.readline(), 30)).decode().split()
            assert line[0] == "ports", line
            self.ports = [int(p) for p in line[1:]]
        self.redis_memory_before = await asyncio.to_thread(targets.used_memory, self.target.node)
        self.t_origin = now()
        self.audit = Audit(self.settings, self.bounds, self.t_origin)
        if self.sampler.per_tag:
            self.audit.figures["tags on the master the Redis faults hit"] = (
                self.sampler.faulted_tags())
        for slot in range(self.worker_count):
            await self.spawn(slot)
        sampler = asyncio.create_task(self.sample_forever())
        rss = asyncio.create_task(self.watch_rss())
        progress = asyncio.create_task(self.progress())
        try:
            await self.run_schedule()
            await asyncio.sleep(max(0.0, self.t_origin + self.seconds - now()))
            t_told = now()
            await self.stop_workers()
            await self.drain(t_told)
        finally:
            for task in (sampler, rss, progress):
                task.cancel()
            await asyncio.gather(sampler, rss, progress, return_exceptions=True)
        self.audit.faults = [f for f in self.schedule if f.t0]
        self.audit.judge(now())
        self.check_memory()
        return self.audit

    def env(self) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH", "")
        return {**os.environ, "PYTHONPATH": str(TESTS_DIR) + (os.pathsep + path if path else "")}

    def url_for(self, slot: int) -> str:
        if self.cluster:
            return self.target.url
        return f"redis://127.0.0.1:{self.ports[slot]}/0"

    async def spawn(self, slot: int) -> None:
        self.generation[slot] += 1
        name = f"{slot}.{self.generation[slot]}"
        seed = self.seed * 1000 + slot * 37 + self.generation[slot]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "chaos.worker", self.url_for(slot), name, str(seed),
            json.dumps(self.settings.to_json()),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self.env())
        life = WorkerLife(name, slot, process.pid, now())
        self.audit.workers[name] = life
        reader = asyncio.create_task(self.read_events(life, process))
        self.workers[slot] = Worker(life, process, reader)

    async def read_events(self, life: WorkerLife, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None and process.stderr is not None

        async def read_stderr() -> None:
            assert process.stderr is not None
            async for line in process.stderr:
                life.stderr.append(line.decode(errors="replace").rstrip())

        stderr = asyncio.create_task(read_stderr())
        async for line in process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                self.audit.violations.append(Violation("errors", now(), f"{life.name}: {line!r}"))
                continue
            self.audit.event(life.name, event)
        await stderr
        life.exit_code = await process.wait()

    # -- the faults --

    async def run_schedule(self) -> None:
        for fault in self.schedule:
            if fault.snapshot_age:
                await self.sleep_until(fault.at - fault.snapshot_age)
                fault.notes["t_snapshot"] = now()
                fault.notes["snapshot"] = await asyncio.to_thread(
                    targets.snapshot, self.target.node)
            await self.sleep_until(fault.at)
            await self.inject(fault)
            fault.notes.pop("snapshot", None)

    async def sleep_until(self, at: float) -> None:
        await asyncio.sleep(max(0.0, self.t_origin + at - now()))

    async def inject(self, fault: Fault) -> None:
        node = self.target.node
        worker = self.workers[fault.slot] if fault.slot is not None else None
        if worker is not None:
            fault.notes["worker"] = worker.life.name
        fault.t0 = now()
        if fault.kind == "redis_pause":
            node.pause()
            await asyncio.sleep(fault.duration)
            node.resume()
        elif fault.kind == "redis_restart":
            await asyncio.to_thread(targets.kill, node)
            await asyncio.sleep(fault.duration)
            await asyncio.to_thread(targets.start_empty, self.target)
        elif fault.kind == "redis_restore":
            snapshot = fault.notes["snapshot"]
            assert isinstance(snapshot, bytes)
            await asyncio.to_thread(targets.kill, node)
            await asyncio.sleep(fault.duration)
            await asyncio.to_thread(targets.start_from, self.target, snapshot)
        elif fault.kind == "script_flush":
            await asyncio.to_thread(targets.script_flush, self.target)
        elif fault.kind == "worker_kill":
            assert worker is not None and fault.slot is not None
            worker.process.kill()
            await worker.process.wait()
            t_dead = now()
            await worker.reader  # every event it wrote before it died
            self.audit.killed(worker.life.name, t_dead)
            await asyncio.sleep(fault.duration)
            await self.spawn(fault.slot)
        elif fault.kind == "worker_stop":
            assert worker is not None
            # A worker that died meanwhile is the auditor's to report (it exited unasked): the
            # fault has no process left to stop or wake.
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGSTOP)
            await asyncio.sleep(fault.duration)
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGCONT)
        elif fault.kind == "net_cut":
            await self.tell_proxy(f"cut {fault.slot} {fault.mode}")
            await asyncio.sleep(fault.duration)
            await self.tell_proxy(f"heal {fault.slot}")
        fault.t1 = now()

    async def tell_proxy(self, command: str) -> None:
        assert self.proxy is not None and self.proxy.stdin and self.proxy.stdout
        self.proxy.stdin.write(command.encode() + b"\n")
        await self.proxy.stdin.drain()
        assert (await self.proxy.stdout.readline()).strip() == b"ok"

    # -- watching --

    async def sample_forever(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(SAMPLE_EVERY)

    async def sample(self) -> None:
        self.audit.samples += await self.sampler.read()

    async def watch_rss(self) -> None:
        while True:
            for worker in list(self.workers.values()):
                rss = _rss(worker.process.pid)
                if rss is not None and worker.process.returncode is None:
                    worker.life.rss.append((now(), rss))
            await asyncio.sleep(RSS_EVERY)

    async def progress(self) -> None:
        while True:
            await asyncio.sleep(30)
            done = sum(1 for f in self.schedule if f.t1)
            self.say(
                f"  [{now() - self.t_origin:5.0f}s] streams {self.audit.outcomes['started']}, "
                f"faults {done}/{len(self.schedule)}, samples {len(self.audit.samples)}")

    # -- the end --

    async def stop_workers(self) -> None:
        for worker in self.workers.values():
            if worker.process.returncode is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers.values():
            try:
                await asyncio.wait_for(worker.reader, 60)
            except asyncio.TimeoutError:
                self.audit.violations.append(Violation(
                    "errors", now(), f"worker {worker.life.name} did not stop within 60 s"))
                worker.process.kill()
                await worker.process.wait()

    async def drain(self, t_told: float) -> None:
        """After the workers are gone, every pool must count 0 and every key go, within the
        bound: a worker's leases within ``lease_seconds`` of its exit or death (those it could
        not release expire with its holder), then the line's keys, which live
        2 x max(lease_seconds, 3 s) after the last waiter's call. An observer's count (any
        call in the tag reaps expired holders) runs until every pool is empty; then the walk
        markers it leaves expire (1 s). The tag's
        clock (``holders:clock``, the clock-step guard's) is written by any call in the tag and
        lives 1 h; a budgeted stream's settlement marker (``settled:<id>``, which keeps a
        retried settlement from counting twice) lives 10 minutes, and a model's answer sizes
        (``answers:<model>``, what ``reserve="auto"`` learns from) a week after its last
        settlement. Every key seen meanwhile must have a TTL, those three within their
        lifetimes, but a pool: an acquire makes one without (its holders' keep-alives give it
        one), and it lives no longer than its members, whom the count removes."""
        b = self.bounds
        t_gone = now()
        kills = [f.t0 for f in self.schedule if f.kind == "worker_kill" and f.t0]
        deadline = max(t_gone, max(kills, default=0.0)) + b.lease + 2 * max(b.lease, 3.0) + 1.0
        observer = StreamLeaseManager(url=self.target.url, config=LeaseConfig(
            key_prefix=self.settings.key_prefix, identity_secret=self.settings.identity_secret,
            lease_seconds=self.settings.lease_seconds))
        # The nodes that hold the run's keys (under lease_global_slots on the cluster, every
        # master: the users' own tags spread over them); a key lives on one of them.
        clients = {port: redis_asyncio.Redis(host="127.0.0.1", port=port)
                   for port in self.sampler.ports()}
        port_of: dict[bytes, int] = {}
        left: list[bytes] = []
        no_ttl: set[bytes] = set()
        last_seen: dict[str, float] = {}
        clock = f"{self.settings.holders_key}:clock".encode()
        counting = True
        try:
            while True:
                if counting:
                    counting = await observer.get_active_count() > 0
                await self.sample()
                # Braces are plain characters in a KEYS pattern; users' own tags are
                # "{<prefix>:<digest>}" (lease_global_slots), each with a clock of its own.
                keys = []
                for port, client in clients.items():
                    for pattern in (self.settings.tag, "{" + self.settings.key_prefix + ":"):
                        for key in await client.keys(pattern + "*"):
                            if isinstance(key, bytes):
                                keys.append(key)
                                port_of[key] = port
                for key in keys:
                    last_seen[_kind_of_key(key.decode(), self.settings.tag)] = now()
                    if (not _is_pool(key, self.settings.tag)
                            and await clients[port_of[key]].pttl(key) == -1):
                        no_ttl.add(key)
                left = [key for key in keys
                        if key != clock and not key.endswith(b"}:holders:clock")
                        and _outlives_drain(key) is None]
                for key in keys:
                    lifetime = _outlives_drain(key)
                    if lifetime is not None and await clients[port_of[key]].pttl(key) > lifetime:
                        no_ttl.add(key)
                counting = counting or any(b":walked:" not in key for key in left)
                if not left or now() > deadline:
                    break
                await asyncio.sleep(0.2)
        finally:
            await observer.aclose()
            for client in clients.values():
                await client.aclose()
        self.audit.drain = {
            "workers gone after told (s)": round(t_gone - t_told, 1),
            "keys gone after (s)": round(now() - t_gone, 2),
            "bound (s)": round(deadline - t_gone, 2),
            "last seen (s)": {k: round(t - t_gone, 2) for k, t in sorted(last_seen.items())},
        }
        if left:
            self.audit.violations.append(Violation(
                "drain", now(), f"{len(left)} keys left {now() - t_gone:.1f}s after the workers "
                f"were gone: {await self.describe_keys(left[:10], port_of)}"))
        for key in sorted(no_ttl):
            self.audit.violations.append(Violation(
                "ttl", now(), f"key {key.decode()} had no expiry, or a longer one than its own"))
        self.redis_memory_after = await asyncio.to_thread(targets.used_memory, self.target.node)

    async def describe_keys(self, keys: list[bytes], port_of: dict[bytes, int]) -> str:
        """Each key with its TTL and what it holds, and the clock of the node that holds it
        (where it is not the run's node), for the report."""
        parts = await self.describe_node_keys(
            self.target.node.port, [key for key in keys if port_of[key] == self.target.node.port])
        for port in sorted({port_of[key] for key in keys} - {self.target.node.port}):
            parts.append(f"node {port}:")
            parts += await self.describe_node_keys(
                port, [key for key in keys if port_of[key] == port])
        return "; ".join(parts)

    async def describe_node_keys(self, port: int, keys: list[bytes]) -> list[str]:
        client = redis_asyncio.Redis(host="127.0.0.1", port=port)
        try:
            seconds, micros = await client.time()
            parts = [f"TIME {seconds * 1000 + micros // 1000}"]
            for key in sorted(keys):
                kind = (await client.type(key)).decode()
                if kind == "zset":
                    held: object = await client.zrange(key, 0, 9, withscores=True)
                elif kind == "set":
                    held = sorted(await client.smembers(key))[:10]  # type: ignore[misc]
                elif kind == "hash":
                    held = await client.hgetall(key)  # type: ignore[misc]
                else:
                    held = await client.get(key)
                parts.append(f"{key.decode()} ({kind}, pttl {await client.pttl(key)}): {held}")
            return parts
        finally:
            await client.aclose()

    def check_memory(self) -> None:
        """A worker's RSS, from 20 s after it started to its end, grows by at most
        max(64 MB, its size then): generous, to catch leaks that grow with streams."""
        growth = {}
        for life in self.audit.workers.values():
            warm = [rss for t, rss in life.rss if t - life.t_spawn >= 20]
            if len(warm) < 2:
                continue
            grew = max(warm) - warm[0]
            growth[life.name] = (warm[0], max(warm), grew)
            if grew > max(64 << 20, warm[0]):
                self.audit.violations.append(Violation(
                    "memory", now(), f"worker {life.name} RSS grew from {warm[0] >> 20} MB to "
                    f"{max(warm) >> 20} MB"))
        self.audit.figures["worker RSS after 20 s -> peak (MB)"] = {
            name: f"{a / 2**20:.1f} -> {b / 2**20:.1f}" for name, (a, b, _) in growth.items()}
        self.audit.figures["Redis used_memory before -> after the drain (KB)"] = (
            f"{self.redis_memory_before >> 10} -> {self.redis_memory_after >> 10}")


def _outlives_drain(key: bytes) -> int | None:
    """The lifetime (ms) of a key meant to outlast the streams that wrote it, else None."""
    if b":settled:" in key:
        return SETTLED_MS
    if b":answers:" in key:
        return ANSWERS_MS
    return None


def _is_pool(key: bytes, tag: str) -> bool:
    """A user's own pool, the global pool or a resource's."""
    return _kind_of_key(key.decode(), tag).startswith(("user:", "global", "resource:"))


def _kind_of_key(key: str, tag: str) -> str:
    """A key's family: ``holders:*``, ``line``, ``user:*``...; a key in a user's own tag
    (``{<prefix>:<digest>}:user``, ...) as the same family."""
    if not key.startswith(tag):
        rest = key.split("}:", 1)[1]
        key = f"{tag}:{'user:*' if rest == 'user' else rest}"
    parts = key[len(tag) + 1:].split(":")
    if parts[0] == "holders" and len(parts) > 1:
        if parts[1] in ("walked", "clock"):
            return f"holders:{parts[1]}"
        return "holders:<id>:members" if parts[-1] == "members" else "holders:<id>"
    if parts[0] == "user":
        return "user:*"
    if parts[0] in ("settled", "answers"):
        return f"{parts[0]}:<id>"
    return ":".join(parts)


def _rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
