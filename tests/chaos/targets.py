"""The Redis deployments a chaos run breaks: one server (behind the proxy), or the 3-master
cluster (the faults hit the master that holds the run's hash tag, the global pool's: under
``lease_global_slots`` the users' own tags that hash to the same master go with it, the others
do not). Every method blocks: the run calls them in a thread."""

from __future__ import annotations

from pathlib import Path

from redis.crc import key_slot

from support.redis_servers import RedisCluster, RedisServer
from support.waiting import wait_until


class SingleRedis:
    """One redis-server on a free loopback port."""

    name = "redis"

    def __init__(self) -> None:
        self.server = RedisServer()

    def start(self) -> SingleRedis:
        self.server.start()
        return self

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def node(self) -> RedisServer:
        """The server that holds the run's keys."""
        return self.server

    @property
    def nodes(self) -> list[RedisServer]:
        return [self.server]

    def node_for(self, key: str) -> RedisServer:
        return self.server

    def wait_ready(self) -> None:
        wait_until(self.server.ping, what="Redis to answer")

    def cleanup(self) -> None:
        self.server.cleanup()


class Cluster:
    """Three masters, no replicas. The run's keys share one hash tag, so one master holds them,
    but under ``lease_global_slots``: each user's keys are in a tag of its own, on whichever
    master serves its slot (``node_for``)."""

    name = "cluster"

    def __init__(self, tag: str) -> None:
        self.cluster = RedisCluster()
        self.tag = tag
        self._node: RedisServer | None = None
        # Each master's slot ranges (no replicas, no failover: they never move).
        self._owned: list[tuple[RedisServer, list[tuple[int, int]]]] = []

    def start(self) -> Cluster:
        self.cluster.start()
        self._owned = [(node, _owned_slots(node)) for node in self.cluster.nodes]
        self._node = self.node_for(self.tag)
        return self

    def node_for(self, key: str) -> RedisServer:
        """The master that serves ``key``'s slot."""
        slot = key_slot(key.encode())
        for node, owned in self._owned:
            if any(lo <= slot <= hi for lo, hi in owned):
                return node
        raise AssertionError(f"no master owns the slot of {key}")

    @property
    def url(self) -> str:
        return self.cluster.url

    @property
    def node(self) -> RedisServer:
        assert self._node is not None
        return self._node

    @property
    def nodes(self) -> list[RedisServer]:
        return self.cluster.nodes

    def wait_ready(self) -> None:
        wait_until(
            lambda: self.node.ping() and "cluster_state:ok" in self.node.cli("cluster", "info"),
            timeout=30, what="the cluster to serve the tag's slot again",
        )

    def cleanup(self) -> None:
        self.cluster.cleanup()


def _owned_slots(node: RedisServer) -> list[tuple[int, int]]:
    """The slot ranges ``node`` serves, from its own CLUSTER NODES line."""
    for line in node.cli("cluster", "nodes").splitlines():
        fields = line.split()
        if "myself" in fields[2]:
            ranges = []
            for item in fields[8:]:
                if item.startswith("["):
                    continue
                lo, _, hi = item.partition("-")
                ranges.append((int(lo), int(hi or lo)))
            return ranges
    return []


# -- the faults on a target's node (blocking) --

def kill(node: RedisServer) -> None:
    node.stop()


def start_empty(target: SingleRedis | Cluster) -> None:
    (target.node.dir / "dump.rdb").unlink(missing_ok=True)
    _start(target)


def start_from(target: SingleRedis | Cluster, snapshot: bytes) -> None:
    (target.node.dir / "dump.rdb").write_bytes(snapshot)
    _start(target)


def _start(target: SingleRedis | Cluster) -> None:
    target.node.start()
    target.wait_ready()


def snapshot(node: RedisServer) -> bytes:
    node.cli("save")
    data = (Path(node.dir) / "dump.rdb").read_bytes()
    return data


def script_flush(target: SingleRedis | Cluster) -> None:
    for node in target.nodes:
        node.cli("script", "flush")


def used_memory(node: RedisServer) -> int:
    for line in node.cli("info", "memory").splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":")[1])
    return 0
