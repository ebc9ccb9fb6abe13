"""How one manager's work spreads over a 3-master Redis Cluster, with and without a global pool.

The pools of one atomic acquire must share a slot. With the global pool (the default) every key
of a manager shares the ``{key_prefix}`` hash tag, so one shard serves every acquire; with
``global_pool=False`` each user's pool has a tag of its own and users spread across shards.

Starts its own 3-master cluster on free loopback ports (``redis-server --cluster-enabled yes``,
``redis-cli --cluster create``), runs the same acquire + release cycles for 300 users under each
layout, and prints the keys held and the commands run on each shard (``INFO commandstats``).
Run it with ``bash benchmarks/run.sh``, or alone:
``benchmarks/.venv/bin/python benchmarks/cluster_spread.py``.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis
from common import RESULTS_DIR, command_calls, free_port, machine_info, print_table, write_json

from fastapi_stream_lease import LeaseConfig, StreamLeaseManager

USERS = 300
CYCLES_PER_USER = 20


def start_cluster(directory: Path) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    ports: list[int] = []
    while len(ports) < 3:  # room for the cluster bus port (port + 10000)
        port = free_port()
        if port < 55_000 and port not in ports:
            ports.append(port)
    nodes = []
    for port in ports:
        node_dir = directory / str(port)
        node_dir.mkdir()
        nodes.append(subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--cluster-enabled", "yes", "--dir", str(node_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
    time.sleep(0.5)
    subprocess.run(
        ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
         "--cluster-replicas", "0", "--cluster-yes"],
        check=True, capture_output=True, timeout=60,
    )
    for _ in range(300):  # bounded: about 30 s
        infos = [subprocess.run(["redis-cli", "-p", str(p), "cluster", "info"],
                                capture_output=True, text=True).stdout for p in ports]
        if all("cluster_state:ok" in info for info in infos):
            break
        time.sleep(0.1)
    return nodes, ports


async def count_keys(shard: aioredis.Redis, prefix: str) -> int:
    return len([key async for key in shard.scan_iter(match=f"{{{prefix}*", count=1000)])


async def run_layout(ports: list[int], global_pool: bool) -> dict[str, list[int]]:
    prefix = f"spread-{'global' if global_pool else 'users'}"
    config = LeaseConfig(key_prefix=prefix, max_per_user=0, global_pool=global_pool,
                         **({"max_global": 0} if global_pool else {}))
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    manager = StreamLeaseManager(url=url, config=config)
    shards = [aioredis.Redis(port=p) for p in ports]
    before = [(await command_calls(s))[0] for s in shards]

    async def cycles(user: int) -> list[object]:
        held = []
        for _ in range(CYCLES_PER_USER - 1):
            await (await manager.acquire(f"user{user}")).release()
        held.append(await manager.acquire(f"user{user}"))  # one lease per user stays held
        return held

    held = await asyncio.gather(*(cycles(u) for u in range(USERS)))
    keys = [await count_keys(shard, prefix) for shard in shards]
    after = [(await command_calls(s))[0] for s in shards]
    del held
    await manager.aclose()
    for shard in shards:
        await shard.aclose()
    return {"keys": keys, "commands": [a - b for a, b in zip(after, before, strict=True)]}


async def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="spread-"))
    nodes, ports = start_cluster(directory)
    try:
        results = {
            "global pool (default)": await run_layout(ports, global_pool=True),
            "global_pool=False": await run_layout(ports, global_pool=False),
        }
    finally:
        for node in nodes:
            node.kill()
            node.wait()
        shutil.rmtree(directory, ignore_errors=True)
    rows = [
        [layout, *(f"{k:,} / {c:,}" for k, c in zip(r["keys"], r["commands"], strict=True))]
        for layout, r in results.items()
    ]
    print(f"\n{USERS} users x {CYCLES_PER_USER} acquire + release cycles, one lease each left held")
    print_table(["layout", "shard 1 keys / commands", "shard 2", "shard 3"], rows, left=1)
    write_json(RESULTS_DIR / "cluster_spread.json", {"machine": machine_info(), "results": results})


if __name__ == "__main__":
    asyncio.run(main())
