"""A real Redis Cluster on loopback (tests): three masters, each with one replica.

All six nodes are the ``redis-server`` binary the suite already finds (``find_redis_server``),
started with ``--cluster-enabled yes``; the cluster is formed with redis-py (``CLUSTER MEET``,
``ADDSLOTS``, ``REPLICATE``), so no ``redis-cli`` is needed. Redis 6.2 puts a node's cluster bus
on ``port + 10000``: ports are picked below 55536 with that second port free too. The node timeout
is short on purpose (1 s), so a master killed with SIGKILL is replaced by its replica in a few
seconds. ``url`` is the ``redis+cluster://`` URL valetkey takes (every master as a seed).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from pathlib import Path

import redis

from contract.errors import Reason, ServiceError
from valetkey.dev.sentinel import DataNode
from valetkey.dev.services import LOOPBACK, LocalService, Topology

SLOTS = 16384
NODE_TIMEOUT_MS = 1000
FORM_TIMEOUT = 30.0  # seconds for the nodes to meet and the replicas to sync
BUS_OFFSET = 10000  # Redis 6.2: the cluster bus listens on port + 10000


def free_cluster_port() -> int:
    """A loopback port free with its bus port (``port + 10000``) free too."""
    for _ in range(200):
        port = random.randint(20000, 55000)  # noqa: S311 - a port, not a secret
        try:
            for candidate in (port, port + BUS_OFFSET):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind((LOOPBACK, candidate))
        except OSError:
            continue
        return port
    raise ServiceError("no free pair of loopback ports for a cluster node", Reason.REDIS_UNAVAILABLE)


class ClusterNode(DataNode):
    """One cluster node; which one is a master is decided when the cluster is formed."""

    def __repr__(self) -> str:
        return f"ClusterNode(port={self.port}, running={self.running})"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_cluster_port()
        self.url = f"redis://{LOOPBACK}:{self.port}/0"

    def command(self, workdir: Path) -> list[str]:
        return [*super().command(workdir), "--cluster-enabled", "yes",
                "--cluster-config-file", str(workdir / "nodes.conf"),
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                # a replica takes over however long ago it last heard its master (tests kill them)
                "--cluster-replica-validity-factor", "0"]

    def client(self, timeout: float = 1.0) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=timeout,
                           socket_connect_timeout=timeout)

    def node_id(self) -> str:
        with self.client() as client:
            return str(client.execute_command("CLUSTER", "MYID").decode())


class ClusterTopology(Topology):
    def __init__(self, masters: int = 3, replicas: bool = True) -> None:
        self.masters: list[ClusterNode] = [ClusterNode() for _ in range(masters)]
        self.replicas: list[ClusterNode] = [ClusterNode() for _ in range(masters)] if replicas else []

    @property
    def nodes(self) -> list[ClusterNode]:
        return [*self.masters, *self.replicas]

    def services(self) -> list[LocalService]:
        return list(self.nodes)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{LOOPBACK}:{n.port}" for n in self.masters)

    def form(self) -> None:
        timeout = FORM_TIMEOUT
        for node in self.nodes:
            node.start()
        first = self.masters[0]
        with first.client() as client:
            for node in self.nodes[1:]:
                client.execute_command("CLUSTER", "MEET", LOOPBACK, node.port)
        share = SLOTS // len(self.masters)
        for index, master in enumerate(self.masters):
            end = SLOTS if index == len(self.masters) - 1 else (index + 1) * share
            with master.client() as client:
                client.execute_command("CLUSTER", "ADDSLOTS", *range(index * share, end))
        self._wait(lambda: all(self._known(n) == len(self.nodes) for n in self.nodes),
                   "the nodes to meet", timeout)
        for master, replica in zip(self.masters, self.replicas, strict=False):
            master_id = master.node_id()
            with replica.client() as client:
                client.execute_command("CLUSTER", "REPLICATE", master_id)
        self._wait(self.healthy, "the cluster to be ready", timeout)

    def healthy(self) -> bool:
        """Every running node says ``cluster_state:ok`` and every replica is in sync."""
        for node in self.nodes:
            if not node.running:
                continue
            with node.client() as client:
                if client.cluster("info").get("cluster_state") != "ok":
                    return False
                role = client.info("replication")
                if role.get("role") == "slave" and role.get("master_link_status") != "up":
                    return False
        return True

    def master_of(self, key: str) -> ClusterNode:
        """The node serving ``key``'s slot now, as a running node sees it."""
        for node in self.nodes:
            if not node.running:
                continue
            with node.client() as client:
                slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
                for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(primary[1])
                        return next(n for n in self.nodes if n.port == port)
        raise ServiceError("no running cluster node answers", Reason.REDIS_UNAVAILABLE)

    def kill_master_of(self, key: str) -> ClusterNode:
        """SIGKILL the master serving ``key`` (no shutdown, no save); returns it."""
        node = self.master_of(key)
        node.kill()
        return node

    def wait_promoted(self, key: str, old: ClusterNode, timeout: float = 30.0) -> ClusterNode:
        """Wait until ``key``'s slot is served by a node other than ``old`` (its replica)."""
        self._wait(lambda: self.master_of(key) is not old and self._slot_ok(key), "a replica to be promoted",
                   timeout)
        return self.master_of(key)

    def _slot_ok(self, key: str) -> bool:
        with self.master_of(key).client() as client:
            return bool(client.cluster("info").get("cluster_state") == "ok")

    @staticmethod
    def _known(node: ClusterNode) -> int:
        with node.client() as client:
            return len(client.execute_command("CLUSTER", "NODES").decode().strip().splitlines())

    def _wait(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        self.wait(ready, what, timeout, Reason.REDIS_UNAVAILABLE, (redis.RedisError, OSError))
