"""A three-node OpenBao cluster with integrated storage (Raft) on loopback, for the tests and
``valetkey dev --ha``: initialised (one Shamir key share) and unsealed here, nodes 2 and 3 joined
through ``retry_join``, a KV v2 mount at ``secret/`` as a dev server has.

``addrs`` lists every node's API address (what ``VAULT_ADDR`` may list); ``leader()`` names the
active node; ``kill(index)`` SIGKILLs one node and ``restart(index)`` brings it back (unsealed,
with its data). The root token and the unseal key never appear in a repr or a log tail.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from contract.errors import Reason, ServiceError
from valetkey.dev.services import LOOPBACK, READY_TIMEOUT, LocalService, find_bao, free_port

NODES = 3
CLUSTER_TIMEOUT = 60.0


class RaftNode(LocalService):
    name = "openbao-raft"
    reason = Reason.VAULT_UNAVAILABLE
    keeps_data = True

    def __init__(self, index: int, peers: list[str]) -> None:
        super().__init__(find_bao(), None, READY_TIMEOUT)
        self.index = index
        self.cluster_port = free_port()
        self.addr = f"http://{LOOPBACK}:{self.port}"
        self.peers = peers  # every node's API address, this one's included

    def command(self, workdir: Path) -> list[str]:
        data = workdir / "raft"
        data.mkdir(exist_ok=True)
        joins = "".join(f'  retry_join {{\n    leader_api_addr = "{p}"\n  }}\n'
                        for p in self.peers if p != self.addr)
        conf = workdir / "bao.hcl"
        conf.write_text(
            f'storage "raft" {{\n  path = "{data}"\n  node_id = "node{self.index}"\n'
            f"  performance_multiplier = 1\n{joins}}}\n"
            f'listener "tcp" {{\n  address = "{LOOPBACK}:{self.port}"\n'
            f'  cluster_address = "{LOOPBACK}:{self.cluster_port}"\n  tls_disable = true\n}}\n'
            f'api_addr = "{self.addr}"\ncluster_addr = "https://{LOOPBACK}:{self.cluster_port}"\n'
            "disable_mlock = true\n")
        return [self.binary, "server", f"-config={conf}"]

    def environment(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "BAO_"))}

    def probe(self) -> str | None:
        try:
            httpx.get(f"{self.addr}/v1/sys/health", timeout=2.0)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}"
        return None  # listening: sealed or not initialised is what the cluster handles next

    def health(self) -> int:
        try:
            return httpx.get(f"{self.addr}/v1/sys/health", timeout=1.0).status_code
        except httpx.HTTPError:
            return 0

    def kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


class RaftCluster:
    def __init__(self) -> None:
        self.nodes: list[RaftNode] = []
        self.root_token = ""
        self._unseal_key = ""

    def __repr__(self) -> str:
        return f"RaftCluster(addrs={self.addrs!r})"

    @property
    def addrs(self) -> list[str]:
        return [n.addr for n in self.nodes]

    @property
    def addr(self) -> str:
        """``VAULT_ADDR`` for valetkey: every node, comma-separated."""
        return ",".join(self.addrs)

    def start(self) -> RaftCluster:
        try:
            ports = [free_port() for _ in range(NODES)]
            peers = [f"http://{LOOPBACK}:{p}" for p in ports]
            for index, port in enumerate(ports):
                node = RaftNode(index + 1, peers)
                node.port, node.addr = port, peers[index]
                self.nodes.append(node)
            first = self.nodes[0]
            first.start()
            answer = httpx.put(f"{first.addr}/v1/sys/init",
                               json={"secret_shares": 1, "secret_threshold": 1}, timeout=30).json()
            self.root_token, self._unseal_key = answer["root_token"], answer["keys_base64"][0]
            self._unseal(first)
            self._wait(lambda: first.health() == 200, "node 1 to become active")
            # joiners become voters once stable for this long (default 10 s)
            self._request("POST", "sys/storage/raft/autopilot/configuration",
                          {"server_stabilization_time": "1s", "dead_server_last_contact_threshold": "1m"})
            for node in self.nodes[1:]:
                node.start()
            self._wait(lambda: all([self._unseal(n) for n in self.nodes[1:]]),
                       "nodes 2 and 3 to join and unseal")
            self._wait(lambda: self._voters() == NODES, "three voters in the Raft configuration")
            self._request("POST", "sys/mounts/secret", {"type": "kv", "options": {"version": "2"}})
            self._wait(self._kv_ready, "the KV v2 mount to finish its upgrade on every node")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RaftCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def leader(self) -> int | None:
        """The index of the active node, if any answers 200 on sys/health."""
        for index, node in enumerate(self.nodes):
            if node.running and node.health() == 200:
                return index
        return None

    def kill(self, index: int) -> None:
        self.nodes[index].kill()

    def restart(self, index: int) -> None:
        node = self.nodes[index]
        node.start()
        self._wait(lambda: self._unseal(node), f"node {node.index} to unseal")

    def wait_leader(self, not_index: int | None = None, timeout: float = CLUSTER_TIMEOUT) -> int:
        self._wait(lambda: self.leader() not in (None, not_index), "a new active node", timeout)
        index = self.leader()
        if index is None:
            raise ServiceError("no active OpenBao node", Reason.VAULT_UNAVAILABLE)
        return index

    def _unseal(self, node: RaftNode) -> bool:
        try:
            answer = httpx.put(f"{node.addr}/v1/sys/unseal", json={"key": self._unseal_key},
                               timeout=10).json()
        except (httpx.HTTPError, ValueError):
            return False
        return answer.get("sealed") is False

    def _kv_ready(self) -> bool:
        for node in self.nodes:  # a standby answers 400 until the active node's upgrade is done
            try:
                response = httpx.post(f"{node.addr}/v1/secret/data/valetkey-localstack/ready",
                                      json={"data": {"ready": "yes"}}, timeout=5,
                                      headers={"X-Vault-Token": self.root_token})
            except httpx.HTTPError:
                return False
            if response.status_code != 200:
                return False
        return True

    def _voters(self) -> int:
        try:
            body = self._request("GET", "sys/storage/raft/configuration")
        except ServiceError:
            return 0
        servers = body.get("data", {}).get("config", {}).get("servers", [])
        return sum(1 for s in servers if s.get("voter"))

    def _request(self, method: str, path: str, body: object = None) -> dict[str, Any]:
        for node in self.nodes:
            if not node.running:
                continue
            try:
                response = httpx.request(method, f"{node.addr}/v1/{path}", json=body, timeout=10,
                                         headers={"X-Vault-Token": self.root_token})
            except httpx.HTTPError:
                continue
            if response.status_code < 300:
                answer: dict[str, Any] = response.json() if response.content else {}
                return answer
        raise ServiceError(f"OpenBao cluster: {method} {path} failed on every node", Reason.VAULT_UNAVAILABLE)

    def _wait(self, ready: object, what: str, timeout: float = CLUSTER_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if callable(ready) and ready():
                return
            if time.monotonic() > deadline:
                tails = "\n".join(n.log_tail()[-800:] for n in self.nodes)
                raise ServiceError(f"OpenBao cluster: timed out waiting for {what}; logs:\n{tails}",
                                   Reason.VAULT_UNAVAILABLE)
            time.sleep(0.2)
