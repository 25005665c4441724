"""A real Redis Sentinel topology on loopback (tests, ``valetkey dev --ha``): one primary, one
replica, three sentinels.

All five are the ``redis-server`` binary the suite already finds (``find_redis_server``); the
sentinels run it with ``--sentinel``. ``url`` is the ``redis+sentinel://`` URL valetkey takes.
``kill_primary()`` SIGKILLs the current primary (no shutdown, no save); ``wait_promoted(old)``
waits until the sentinels name another one. Sentinel's own timings are short on purpose
(down after 1 s, failover timeout 5 s) so a failover takes a few seconds, not thirty.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import redis

from contract.errors import Reason, ServiceError
from valetkey.dev.services import (
    LOOPBACK,
    READY_TIMEOUT,
    LocalService,
    RedisServer,
    Topology,
    find_redis_server,
)

SERVICE = "valetkey"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


class DataNode(RedisServer):
    """A data node: the primary, or a replica of ``primary_port``."""

    keeps_data = False

    def __init__(self, primary_port: int | None = None) -> None:
        super().__init__()
        self.primary_port = primary_port

    def command(self, workdir: Path) -> list[str]:
        extra = ["--replicaof", LOOPBACK, str(self.primary_port)] if self.primary_port else []
        return [*super().command(workdir), *extra]

    def kill(self) -> None:
        """SIGKILL: the process dies at once, as a crashed host would."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


class SentinelNode(LocalService):
    name: ClassVar[str] = "redis-sentinel"
    reason: ClassVar[Reason] = Reason.REDIS_UNAVAILABLE

    def __init__(self, primary_port: int) -> None:
        super().__init__(find_redis_server(), None, READY_TIMEOUT)
        self.primary_port = primary_port

    def command(self, workdir: Path) -> list[str]:
        conf = workdir / "sentinel.conf"  # sentinel rewrites its file: one per node, writable
        conf.write_text(
            f"port {self.port}\nbind {LOOPBACK}\ndir {workdir}\n"
            f"sentinel monitor {SERVICE} {LOOPBACK} {self.primary_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n")
        return [self.binary, str(conf), "--sentinel"]

    def probe(self) -> str | None:
        try:
            with redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=2.0) as client:
                client.sentinel_master(SERVICE)
        except redis.RedisError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def primary(self) -> int | None:
        try:
            with redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=1.0) as client:
                answer = client.sentinel_get_master_addr_by_name(SERVICE)
        except redis.RedisError:
            return None
        return int(answer[1]) if answer else None


class SentinelTopology(Topology):
    def __init__(self) -> None:
        self.nodes: list[DataNode] = []
        self.sentinels: list[SentinelNode] = []

    def services(self) -> list[LocalService]:
        return [*self.sentinels, *self.nodes]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{LOOPBACK}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def form(self) -> None:
        primary = DataNode()
        primary.start()
        self.nodes.append(primary)
        replica = DataNode(primary.port)
        replica.start()
        self.nodes.append(replica)
        self._wait(lambda: self._replica_synced(replica), "the replica to sync")
        for _ in range(3):
            sentinel = SentinelNode(primary.port)
            sentinel.start()
            self.sentinels.append(sentinel)
        self._wait(self._sentinels_agree, "the sentinels to find each other and the replica")

    def primary_port(self) -> int | None:
        answers = {s.primary() for s in self.sentinels if s.running}
        answers.discard(None)
        return answers.pop() if len(answers) == 1 else None

    def node(self, port: int) -> DataNode:
        return next(n for n in self.nodes if n.port == port)

    def kill_primary(self) -> int:
        port = self.primary_port()
        if port is None:
            raise ServiceError("the sentinels do not agree on a primary", Reason.REDIS_UNAVAILABLE)
        self.node(port).kill()
        return port

    def wait_promoted(self, old: int, timeout: float = 30.0) -> int:
        self._wait(lambda: self.primary_port() not in (None, old), "a replica to be promoted", timeout)
        port = self.primary_port()
        if port is None:
            raise ServiceError("the sentinels lost the promoted primary again", Reason.REDIS_UNAVAILABLE)
        return port

    def restart(self, port: int) -> None:
        """Bring a killed node back; the sentinels turn it into a replica of the new primary."""
        self.node(port).start()

    def _replica_synced(self, replica: DataNode) -> bool:
        with redis.Redis(host=LOOPBACK, port=replica.port, socket_timeout=1.0) as client:
            return bool(client.info("replication").get("master_link_status") == "up")

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            with redis.Redis(host=LOOPBACK, port=sentinel.port, socket_timeout=1.0) as client:
                state = client.sentinel_master(SERVICE)
            if int(state.get("num-other-sentinels", 0)) < 2 or int(state.get("num-slaves", 0)) < 1:
                return False
        return True

    def _wait(self, ready: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
        self.wait(ready, what, timeout, Reason.REDIS_UNAVAILABLE, (redis.RedisError,))
