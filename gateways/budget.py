"""Per-run budgets, atomic in Redis so every replica shares them.

Rates (``limits.rate: N per P`` on a purpose) use an exact sliding-window log: a sorted set of
request times per (run, purpose), trimmed to the window and checked and added in one Lua script
using Redis server time, so concurrent requests through any number of replicas never exceed N
in any window of P seconds. Totals (``run_limits`` on an upstream: requests, bytes out) are
counters per run. Over budget → 429 ``budget_exceeded`` with ``Retry-After``.

The script calls of all requests that reach ``charge`` in one turn of the event loop leave
together, pipelined on one connection (``ScriptBatch``): a burst of 1,000 concurrent requests
is a few round trips, not 1,000 connections (redis-py's default pool refused all beyond 100).
On a Redis Cluster, redis-py pipelines no script call: there the calls of a turn are sent one by
one, at most ``CLUSTER_CONCURRENCY`` at once (its per-node pools refuse rather than wait).

A generous limit is charged from leases (``gateways/budget_lease.py``): one script call takes
several requests, stamped in the window at the end of the lease's life, and the process spends
them without a round trip; what it did not spend goes back (``_GIVE_BACK``).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError, ResponseError

from contract import keys
from contract.claims import AccessClaims
from contract.errors import Reason, TooManyRequests, Unavailable
from gateways.budget_lease import Grant, Leases, lease_terms
from policies.model import Purpose, Upstream

PREFIX = keys.BUDGET_PREFIX

# KEYS[1] window set, KEYS[2] request total, KEYS[3] bytes total, KEYS[4] leases (member → granted)
# ARGV: limit, period_ms, member, ttl_s, max_requests (0 = none), max_bytes (0 = none),
#       wanted (requests asked for: 1, or a lease's size), lease_ms (0: one request, now)
# returns {allowed (1/0), retry_after_ms, which (0 rate, 1 requests, 2 bytes), granted}
# A lease's requests enter the window at now + lease_ms (the latest they can be spent), so the
# window never counts one of them out before the request it stands for; the window's expiry is
# only ever lengthened, so no call with a shorter lease drops an entry stamped later.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local ttl, max_req, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local granted, lease = math.max(1, tonumber(ARGV[7] or '1')), tonumber(ARGV[8] or '0')
if max_req > 0 then
  local used = tonumber(redis.call('GET', KEYS[2]) or '0')
  if used >= max_req then
    return {0, ttl * 1000, 1, 0}
  end
  granted = math.min(granted, max_req - used)
end
if max_bytes > 0 and tonumber(redis.call('GET', KEYS[3]) or '0') >= max_bytes then
  return {0, ttl * 1000, 2, 0}
end
if limit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
  local count = redis.call('ZCARD', KEYS[1])
  if count >= limit then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, math.max(1, tonumber(oldest[2]) + period - now), 0, 0}
  end
  granted = math.min(granted, limit - count)
  if granted == 1 and lease == 0 then
    redis.call('ZADD', KEYS[1], now, ARGV[3])
  else
    for i = 1, granted do
      redis.call('ZADD', KEYS[1], now + lease, ARGV[3] .. ':' .. i)
    end
  end
  if redis.call('PTTL', KEYS[1]) < period + lease then
    redis.call('PEXPIRE', KEYS[1], period + lease)
  end
end
if max_req > 0 then
  redis.call('INCRBY', KEYS[2], granted)
  redis.call('EXPIRE', KEYS[2], ttl)
end
if lease > 0 then
  redis.call('HSET', KEYS[4], ARGV[3], granted)
  redis.call('EXPIRE', KEYS[4], ttl)
end
return {1, 0, 0, granted}
"""

# A lease's unspent requests given back, once: KEYS[1] window set, KEYS[2] request total,
# KEYS[3] leases; ARGV: member, unspent, whether the request total was charged (1/0). The
# lease's record goes with it, so the same call sent again (a retry after a lost answer) gives
# back nothing more. Returns how many went back.
_GIVE_BACK = """
local granted = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
if granted == 0 then
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[1])
local n = math.min(tonumber(ARGV[2]), granted)
for i = granted - n + 1, granted do
  redis.call('ZREM', KEYS[1], ARGV[1] .. ':' .. i)
end
if tonumber(ARGV[3]) == 1 and n > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('DECRBY', KEYS[2], n)
end
return n
"""
_WHICH = ("rate limit", "request total", "bytes-out total")


MAX_BATCH = 256  # script calls per pipeline
CLUSTER_CONCURRENCY = 16  # script calls in flight at once on a Redis Cluster (no pipelining)


class ScriptBatch:
    """Calls of one Lua script made in the same event-loop turn, sent as one pipeline. Each call
    stays atomic (its own EVALSHA); a Redis failure fails every call of its batch."""

    def __init__(self, client: aioredis.Redis, script: str) -> None:
        self._redis = client
        self._script: Any = client.register_script(script)
        self._pending: list[tuple[list[str], list[Any], asyncio.Future[Any]]] = []
        self._sending: set[asyncio.Task[None]] = set()
        self._cluster = isinstance(client, RedisCluster)
        self._in_flight = asyncio.Semaphore(CLUSTER_CONCURRENCY)

    async def __call__(self, keys: list[str], args: list[Any]) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((keys, args, future))
        return await future

    async def _evalsha(self, batch: list[tuple[list[str], list[Any], asyncio.Future[Any]]]) -> list[Any]:
        """One pipeline of EVALSHA: a NOSCRIPT answer (the call did not run) is in the results.
        (redis-py's ``Script`` in a pipeline first asks ``SCRIPT EXISTS``: a round trip more
        on every request that has a budget.) One call alone skips the pipeline's own cost."""
        if len(batch) == 1:
            keys, args, _ = batch[0]
            try:
                return [await self._redis.evalsha(self._script.sha, len(keys), *keys, *args)]
            except ResponseError as exc:  # NOSCRIPT, or the script's own error: the call's answer
                return [exc]
        async with self._redis.pipeline(transaction=False) as pipe:
            for keys, args, _ in batch:
                pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            answers: list[Any] = await pipe.execute(raise_on_error=False)
        if len(answers) != len(batch):
            raise RedisError(f"pipeline answered {len(answers)} of {len(batch)} calls")
        return answers

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), MAX_BATCH):
            task = asyncio.create_task(self._send(pending[start:start + MAX_BATCH]), name="budget-batch")
            self._sending.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[list[str], list[Any], asyncio.Future[Any]]]) -> None:
        results: list[Any] | None = None
        try:
            if self._cluster:  # redis-py pipelines no EVALSHA on a cluster: one call each, bounded
                results = list(await asyncio.gather(*(self._one(k, a) for k, a, _ in batch),
                                                    return_exceptions=True))
            else:
                results = await self._evalsha(batch)
                missing = [i for i, answer in enumerate(results) if isinstance(answer, NoScriptError)]
                if missing:  # a restarted or flushed Redis: load the script, run those calls again
                    await self._redis.script_load(self._script.script)
                    again = await self._evalsha([batch[i] for i in missing])
                    for i, answer in zip(missing, again, strict=True):
                        results[i] = answer
        except (RedisError, OSError) as exc:
            results = [exc] * len(batch)
        finally:
            if results is None:  # cancelled at shutdown, or a bug: no caller waits for ever
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(RedisError("budget batch did not complete"))
        self._settle(batch, results)

    async def _one(self, names: list[str], args: list[Any]) -> Any:
        async with self._in_flight:
            return await self._script(keys=names, args=args)

    @staticmethod
    def _settle(batch: list[tuple[list[str], list[Any], asyncio.Future[Any]]], results: list[Any]) -> None:
        for (_, _, future), result in zip(batch, results, strict=True):
            if future.done():  # the request went away meanwhile
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


class Budgets:
    def __init__(self, client: aioredis.Redis, upstream: Upstream,
                 since: Callable[[], float | None] = lambda: 0.0) -> None:
        self._redis = client
        self._upstream = upstream
        self._since = since  # when the current generation of Redis data began (contract/generation.py)
        self._script = ScriptBatch(client, _SCRIPT)
        self._give_back: Any = client.register_script(_GIVE_BACK)
        self._leases = Leases()

    async def close(self) -> None:
        """At shutdown: the leases this process holds are given back (``Leases.close``)."""
        await self._leases.close()

    def applies(self, purpose: Purpose) -> bool:
        limits = self._upstream.run_limits
        return purpose.limits.rate is not None or limits.requests is not None or limits.bytes_out is not None

    async def charge(self, claims: AccessClaims, purpose: Purpose, now: float) -> None:
        """Take one request from the run's budgets, or raise 429 with Retry-After: from a lease
        this process holds when the limits are generous (``gateways/budget_lease.py``), else
        by one script call."""
        if not self.applies(purpose):
            return
        since = self._since()
        if since is None or claims.iat < int(since):
            # its counts went with the lost data: refusing is the only answer that cannot overspend
            raise Unavailable("this run's budget counts were lost with Redis's data; mint a new run",
                              Reason.BUDGET_STATE_LOST)
        size, seconds = lease_terms(purpose, self._upstream)

        async def ask(wanted: int, lease_seconds: float) -> Grant:
            return await self._ask(claims, purpose, wanted, lease_seconds)

        if size == 1:
            await ask(1, 0.0)
        else:
            await self._leases.spend((claims.sub, purpose.name), size, seconds, ask)

    async def _ask(self, claims: AccessClaims, purpose: Purpose, wanted: int, seconds: float) -> Grant:
        """The budget script for ``wanted`` requests (a lease of ``seconds`` when more than one)."""
        rate = purpose.limits.rate
        run = keys.budget(claims.sub, self._upstream.name)  # one hash slot per run (Redis Cluster)
        ttl = max(1, claims.exp - int(time.time()) + 60)
        member = secrets.token_hex(8)
        args = [rate.count if rate else 0, rate.period * 1000 if rate else 0, member, ttl,
                self._upstream.run_limits.requests or 0, self._upstream.run_limits.bytes_out or 0,
                wanted, round(seconds * 1000)]
        names = [f"{run}:rate:{purpose.name}", f"{run}:requests", f"{run}:bytes", f"{run}:leases"]
        try:
            allowed, retry_ms, which, granted = await self._script(keys=names, args=args)
        except (RedisError, OSError) as exc:
            raise Unavailable(f"budget state unavailable: {type(exc).__name__}",
                              Reason.REDIS_UNAVAILABLE) from None
        if not allowed:
            retry = max(1, math.ceil(int(retry_ms) / 1000))
            error = TooManyRequests(f"this run's {_WHICH[int(which)]} for {purpose.name} is used up; "
                                    f"retry in {retry}s", Reason.BUDGET_EXCEEDED)
            error.headers = {"retry-after": str(retry)}
            raise error
        counted = 1 if self._upstream.run_limits.requests else 0

        async def give_back(unspent: int) -> object:
            return await self._give_back(keys=[names[0], names[1], names[3]], args=[member, unspent, counted])

        return Grant(int(granted), give_back)

    async def add_bytes(self, claims: AccessClaims, count: int, now: float) -> None:
        """Count response bytes toward the run's bytes-out total (after the response)."""
        if not self._upstream.run_limits.bytes_out or count <= 0:
            return
        key = f"{keys.budget(claims.sub, self._upstream.name)}:bytes"
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.incrby(key, count)
                pipe.expire(key, max(1, claims.exp - int(now) + 60))
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise Unavailable(f"budget state unavailable: {type(exc).__name__}",
                              Reason.REDIS_UNAVAILABLE) from None
