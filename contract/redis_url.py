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
* ``redis+cluster://`` is refused: the revocation write (``HSET`` + ``PUBLISH`` in one ``MULTI``) and
  the reaper's compare-and-replace script are not supported by redis-py's async cluster pipeline,
  and the generation marker and the revocation hash live in different slots. See
  docs/operations.md (16. High availability).

Nothing here prints a URL: it may carry a password.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.sentinel import Sentinel

SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")


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


def check(url: str) -> str:
    """``url`` if valetkey can connect with it, else ``RedisUrlError`` saying what is wrong."""
    scheme = urlsplit(url).scheme
    if scheme in SENTINEL_SCHEMES:
        sentinel_target(url)
    elif scheme in ("redis+cluster", "rediss+cluster"):
        raise RedisUrlError("Redis Cluster is not supported (revocations need MULTI and one slot); "
                            "use redis+sentinel:// for high availability")
    elif scheme not in SCHEMES:
        raise RedisUrlError(f"not a Redis URL (scheme {scheme!r}; use one of {', '.join(SCHEMES)})"
                            if scheme else "not a Redis URL (no scheme)")
    elif scheme != "unix" and not urlsplit(url).hostname:
        raise RedisUrlError(f"not a Redis URL (scheme {scheme!r}, no host)")
    return url


def sentinel_target(url: str) -> SentinelTarget:
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise RedisUrlError("not a redis+sentinel:// URL")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    password = unquote(userinfo.partition(":")[2]) if userinfo else None
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RedisUrlError("each sentinel is host:port (redis+sentinel://h1:26379,h2:26379/service)")
        sentinels.append((host.strip("[]"), int(port)))
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
    return SentinelTarget(sentinels=tuple(sentinels), service=path[0], db=int(db),
                          password=password or None, sentinel_password=sentinel_password,
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


def async_client(url: str, *, max_connections: int = 50, pool_timeout: float = 5.0,
                 socket_timeout: float = 2.0, socket_connect_timeout: float = 2.0,
                 **options: Any) -> aioredis.Redis:
    """One asyncio client with one bounded, blocking pool (waits ``pool_timeout`` for a free
    connection); for Sentinel URLs the pool follows the primary across failovers."""
    check(url)
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
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
