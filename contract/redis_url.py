"""The one place a Redis URL becomes a redis-py client, for every use (broker, gateways, CLI, dev).

Accepted URLs (``VALETKEY_REDIS_URL``, ``--redis``):

* ``redis://[:password@]host:port[/db]``, ``rediss://…`` (TLS), ``unix:///path?db=N``: one server,
  as redis-py's ``from_url`` reads them.
* ``redis+sentinel://[:password@]host:port[,host:port…]/service_name[/db]`` (``rediss+sentinel://``
  for TLS to the data nodes): the primary of ``service_name`` as the sentinels name it, through
  redis-py's Sentinel support. The password is the data nodes'; the sentinels are asked without one
  unless ``?sentinel_password=…`` is given. Every new connection asks the sentinels for the current
  primary; a connection to a primary that was demoted (``READONLY``) or died is dropped and the next
  call reconnects to the promoted one, so no process restarts after a failover. While no sentinel
  names a primary, every call fails with ``MasterNotFoundError`` (a ``RedisError``): callers already
  turn that into ``redis_unavailable`` / ``revocation_state_stale`` (fail closed).
* ``redis+cluster://[:password@]host:port[,host:port…][/0]`` (``rediss+cluster://`` for TLS): a Redis
  Cluster through redis-py's ``RedisCluster``; the nodes listed are seeds, the client learns the
  rest (``CLUSTER SLOTS``) and follows slot moves and failovers. Every multi-key operation valetkey
  makes stays in one hash slot (``contract/keys.py``), so the same code runs on one server, on
  Sentinel and on a cluster. Pub/sub is classic ``PUBLISH``, which a cluster broadcasts to every
  node: a subscriber on any node hears every announcement. Only database 0 exists on a cluster.

Nothing here prints a URL: it may carry a password.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import ClusterPubSub as AsyncClusterPubSub
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.cluster import _ClusterNodePoolAdapter
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES, *CLUSTER_SCHEMES)
CLUSTER_HEADROOM = 16  # connections per cluster node beyond the command limit (pipelines, pub/sub)


class RedisUrlError(ValueError):
    """The URL cannot be used; the message never contains the URL (it may hold a password)."""


@dataclass(frozen=True)
class SentinelTarget:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    password: str | None
    sentinel_password: str | None
    tls: bool

    def __repr__(self) -> str:  # never the passwords
        return f"SentinelTarget(sentinels={self.sentinels!r}, service={self.service!r}, db={self.db})"


@dataclass(frozen=True)
class ClusterTarget:
    seeds: tuple[tuple[str, int], ...]
    password: str | None
    tls: bool

    def __repr__(self) -> str:  # never the password
        return f"ClusterTarget(seeds={self.seeds!r}, tls={self.tls})"


def check(url: str) -> str:
    """``url`` if valetkey can connect with it, else ``RedisUrlError`` saying what is wrong."""
    scheme = urlsplit(url).scheme
    if scheme in SENTINEL_SCHEMES:
        sentinel_target(url)
    elif scheme in CLUSTER_SCHEMES:
        cluster_target(url)
    elif scheme not in SCHEMES:
        raise RedisUrlError(f"not a Redis URL (scheme {scheme!r}; use one of {', '.join(SCHEMES)})"
                            if scheme else "not a Redis URL (no scheme)")
    elif scheme != "unix" and not urlsplit(url).hostname:
        raise RedisUrlError(f"not a Redis URL (scheme {scheme!r}, no host)")
    return url


def _hosts(netloc: str, what: str, example: str) -> tuple[str | None, tuple[tuple[str, int], ...]]:
    """(password, [(host, port)…]) of ``[:password@]h:p[,h:p…]``."""
    userinfo, _, hosts = netloc.rpartition("@")
    password = unquote(userinfo.partition(":")[2]) if userinfo else None
    found: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RedisUrlError(f"each {what} is host:port ({example})")
        found.append((host.strip("[]"), int(port)))
    return password or None, tuple(found)


def cluster_target(url: str) -> ClusterTarget:
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise RedisUrlError("not a redis+cluster:// URL")
    password, seeds = _hosts(parts.netloc, "cluster node", "redis+cluster://h1:6379,h2:6379")
    if parts.path.strip("/") not in ("", "0"):
        raise RedisUrlError("a Redis Cluster has only database 0 (redis+cluster://h1:6379,h2:6379)")
    if parts.query:
        raise RedisUrlError("a redis+cluster:// URL takes no options")
    return ClusterTarget(seeds=seeds, password=password, tls=parts.scheme == "rediss+cluster")


def sentinel_target(url: str) -> SentinelTarget:
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise RedisUrlError("not a redis+sentinel:// URL")
    password, sentinels = _hosts(parts.netloc, "sentinel", "redis+sentinel://h1:26379,h2:26379/service")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise RedisUrlError("name the service after the sentinels: redis+sentinel://…/service_name[/db]")
    db = path[1] if len(path) == 2 else "0"
    if not db.isdigit():
        raise RedisUrlError("the database after the service name is a number")
    query = parse_qs(parts.query)
    unknown = set(query) - {"sentinel_password"}
    if unknown:
        raise RedisUrlError(f"unknown option(s) {sorted(unknown)} (only sentinel_password)")
    sentinel_password = query["sentinel_password"][0] if "sentinel_password" in query else None
    return SentinelTarget(sentinels=sentinels, service=path[0], db=int(db),
                          password=password, sentinel_password=sentinel_password,
                          tls=parts.scheme == "rediss+sentinel")


class _BlockingSentinelPool(AsyncSentinelPool, aioredis.BlockingConnectionPool):
    """The primary's pool, waiting up to ``timeout`` for a free connection rather than failing at
    ``max_connections`` (as ``BlockingConnectionPool`` does for a single server)."""


class _SentinelRedis(aioredis.Redis):
    """A client of the primary that also closes its connections to the sentinels."""

    sentinels: AsyncSentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager, self.sentinels = self.sentinels, None
        if manager is not None:
            await manager.aclose()


class _SyncSentinelRedis(redis.Redis):
    sentinels: Sentinel | None = None

    def close(self) -> None:
        super().close()
        manager, self.sentinels = self.sentinels, None
        for node in manager.sentinels if manager is not None else ():
            node.close()


class _NodePubSub(AsyncClusterPubSub):
    """Classic pub/sub on a cluster: one connection to any node, since ``PUBLISH`` reaches every
    node over the cluster bus. Each subscription takes the next known node (primaries and
    replicas), so after the node of a subscription dies the subscriber's retry lands on another
    one rather than on the dead primary the slot table may still name."""

    cluster: _ClusterRedis

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self.connection is None and self.connection_pool is None:
            await self.cluster.initialize()
            nodes = self.cluster.get_nodes()
            self.cluster.subscriptions += 1
            self.node = nodes[self.cluster.subscriptions % len(nodes)]
            self.connection_pool = _ClusterNodePoolAdapter(self.node)
        return await super().execute_command(*args, **kwargs)


class _ClusterRedis(AsyncRedisCluster):
    """A cluster client whose commands wait for a free slot rather than fail: redis-py's per-node
    pools refuse past ``max_connections`` (``MaxConnectionsError``), where a single server's
    ``BlockingConnectionPool`` waits up to ``pool_timeout``. At most ``limit`` commands are in
    flight (a command sent to every node, ``SCRIPT LOAD``, holds one connection per node); the
    nodes' pools get ``CLUSTER_HEADROOM`` more for pipelines and subscriptions."""

    subscriptions = 0

    def __init__(self, *, limit: int, pool_timeout: float, **kwargs: Any) -> None:
        super().__init__(max_connections=limit + CLUSTER_HEADROOM, **kwargs)
        self._in_flight = asyncio.Semaphore(limit)
        self._pool_timeout = pool_timeout

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(self._pool_timeout):
                await self._in_flight.acquire()
        except TimeoutError:
            raise redis.ConnectionError("no free Redis connection within the pool timeout") from None
        try:
            # redis-py 8.1 resolves a command's policy and slot before it learns the cluster:
            # calls made concurrently on a client not yet initialised were seen to run twice or
            # fail (tests/ha/test_cluster.py, the concurrent budgets); learn it first, once (locked)
            if self._initialize:
                await self.initialize()
            return await super().execute_command(*args, **kwargs)
        finally:
            self._in_flight.release()

    def pubsub(self, node: Any = None, host: str | None = None, port: int | None = None,
               **kwargs: Any) -> AsyncClusterPubSub:
        return _NodePubSub(self, node=node, host=host, port=port, **kwargs)


def async_client(url: str, *, max_connections: int = 50, pool_timeout: float = 5.0,
                 socket_timeout: float = 2.0, socket_connect_timeout: float = 2.0,
                 **options: Any) -> aioredis.Redis:
    """One asyncio client with one bounded, blocking pool (waits ``pool_timeout`` for a free
    connection); for Sentinel URLs the pool follows the primary across failovers."""
    check(url)
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    if urlsplit(url).scheme in CLUSTER_SCHEMES:
        seeds = cluster_target(url)
        cluster = _ClusterRedis(
            startup_nodes=[AsyncClusterNode(host, port) for host, port in seeds.seeds],
            password=seeds.password, ssl=seeds.tls, limit=max_connections, pool_timeout=pool_timeout,
            socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout, **options)
        # the commands valetkey sends are the same on both (tests/ha/test_cluster.py runs them all)
        return cast(aioredis.Redis, cluster)
    if urlsplit(url).scheme in SENTINEL_SCHEMES:
        target = sentinel_target(url)
        manager = AsyncSentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs={**timeouts, "password": target.sentinel_password},
            **timeouts)
        client: _SentinelRedis = manager.master_for(
            target.service, redis_class=_SentinelRedis, connection_pool_class=_BlockingSentinelPool,
            max_connections=max_connections, timeout=pool_timeout, db=target.db,
            password=target.password, ssl=target.tls, **options)
        client.sentinels = manager
        return client
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=pool_timeout, **timeouts, **options)
    return aioredis.Redis.from_pool(pool)


def sync_client(url: str, *, socket_timeout: float = 5.0, socket_connect_timeout: float = 5.0,
                **options: Any) -> redis.Redis:
    """A blocking client (tools: the CLI's checks, the benchmarks, the dev stack)."""
    check(url)
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    if urlsplit(url).scheme in CLUSTER_SCHEMES:
        seeds = cluster_target(url)
        nodes = [ClusterNode(host, port) for host, port in seeds.seeds]  # type: ignore[no-untyped-call]
        cluster = RedisCluster(startup_nodes=nodes, password=seeds.password, ssl=seeds.tls,
                               socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout,
                               **options)
        return cast(redis.Redis, cluster)
    if urlsplit(url).scheme in SENTINEL_SCHEMES:
        target = sentinel_target(url)
        manager = Sentinel(list(target.sentinels),  # type: ignore[no-untyped-call]
                           sentinel_kwargs={**timeouts, "password": target.sentinel_password}, **timeouts)
        client: _SyncSentinelRedis = manager.master_for(  # type: ignore[no-untyped-call]
            target.service, redis_class=_SyncSentinelRedis, db=target.db, password=target.password,
            ssl=target.tls, **options)
        client.sentinels = manager
        return client
    return redis.Redis.from_url(url, **timeouts, **options)
