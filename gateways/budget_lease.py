"""Budget leases: a replica takes several of a run's requests from Redis in one script call and
spends them from memory, so a budgeted request does not wait on a Redis round trip, and renews
the lease in the background before it runs out.

    size, seconds = lease_terms(purpose, upstream)    # (1, 0.0): charged one request at a time
    leases = Leases()
    await leases.spend(key, size, seconds, ask)       # ask(wanted, seconds) -> Grant: the budget
                                                      # script; its refusal is raised as it is

What stays exact (the promise of ``gateways/budget.py``): the limit is never exceeded, across any
number of replicas. A lease's requests are counted in Redis when it is granted: in the request
total at once, and in the rate's window stamped at *grant time + lease seconds* (the latest moment
one of them can be spent), so the window never lets one of them out before the request it stands
for. A lease is spent only within ``SPEND_WITHIN`` of its lifetime, measured from before the ask
(Redis's clock reads later than that), then given back: its unspent requests leave the window and
the total (``_GIVE_BACK``), also when a renewal replaces it.

What it costs: while a replica holds unspent requests, another replica can be refused up to that
many requests before the limit (at most ``size - 1`` per other replica, for at most one lease's
lifetime). So only generous limits lease: one leased request per ``PER_REQUEST`` of the limit
(``"120 per 1m"`` leases 3, ``"600 per 1m"`` 16, ``"30 per 1m"`` none), at most ``MAX_SIZE``,
and never where a bytes-out total applies (bytes are known only after each response). A lease
lives ``LEASE_SECONDS``, or a quarter of a short rate period. A process that stops holding a
lease gives nothing back: its requests leave the window with the period and stay in the total.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from contract.errors import ValetkeyError
from policies.model import Purpose, Upstream

log = logging.getLogger("valetkey.gateway")
LEASE_SECONDS = 1.0
MIN_SECONDS = 0.05  # a rate period too short for a lease this long is charged request by request
SPEND_WITHIN = 0.8  # of a lease's lifetime, from before the ask: its requests are spent in this
RENEW_AT = 0.5  # a lease half spent, or half its lifetime gone, is renewed in the background
MAX_SIZE = 16
PER_REQUEST = 32  # of the limit, per leased request

Key = tuple[str, str]  # (run, purpose)


def lease_terms(purpose: Purpose, upstream: Upstream) -> tuple[int, float]:
    """(requests per lease, its lifetime in seconds); (1, 0.0) is one request at a time."""
    if upstream.run_limits.bytes_out is not None:
        return 1, 0.0
    size, seconds = MAX_SIZE, LEASE_SECONDS
    rate, total = purpose.limits.rate, upstream.run_limits.requests
    if rate is not None:
        size = min(size, rate.count // PER_REQUEST)
        seconds = min(seconds, rate.period / 4)
    if total is not None:
        size = min(size, total // PER_REQUEST)
    if size <= 1 or seconds < MIN_SECONDS:
        return 1, 0.0
    return size, seconds


@dataclass
class Grant:
    """What Redis granted: ``granted`` requests named ``member:1..granted``; ``give_back`` returns
    the unspent ones (from index ``first``)."""

    granted: int
    member: str
    give_back: Callable[[str, int, int], Awaitable[object]]


@dataclass
class Lease:
    grant: Grant
    asked: float  # loop time before the ask
    seconds: float
    spent: int = 0

    def usable(self, now: float) -> bool:
        return self.spent < self.grant.granted and now < self.asked + self.seconds * SPEND_WITHIN

    def due(self, now: float) -> bool:
        return self.spent >= self.grant.granted * RENEW_AT or now >= self.asked + self.seconds * RENEW_AT


Ask = Callable[[int, float], Awaitable[Grant]]


class Leases:
    """The leases of one gateway process for one upstream, by (run, purpose)."""

    def __init__(self) -> None:
        self._held: dict[Key, Lease] = {}
        self._asking: dict[Key, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._held)

    async def spend(self, key: Key, size: int, seconds: float, ask: Ask) -> None:
        """One request from the held lease; else wait for the ask in flight (twice at most); else
        ask for a lease, or for this one request alone while another ask is in flight (so one
        process holds at most one lease per run and purpose, and a burst is not refused early
        by leases it took for itself). A refusal or an unavailable Redis is raised by ``ask``
        as for a request without a lease."""
        loop = asyncio.get_running_loop()
        for attempt in range(3):
            lease = self._held.get(key)
            if lease is not None and lease.usable(loop.time()):
                lease.spent += 1
                if lease.due(loop.time()) and (done := self._begin(key)) is not None:
                    self._background(self._renew(key, size, seconds, ask, done))
                return
            asking = self._asking.get(key)
            if asking is None or attempt == 2:
                break
            await asyncio.shield(asking)
        done = self._begin(key)
        if done is None:
            await ask(1, 0.0)
        else:
            await self._take(key, size, seconds, ask, done, spend=True)

    def _begin(self, key: Key) -> asyncio.Future[None] | None:
        """Register the ask for ``key`` (others wait on it); None when one is already in flight."""
        if key in self._asking:
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._asking[key] = done
        return done

    async def _take(self, key: Key, size: int, seconds: float, ask: Ask, done: asyncio.Future[None] | None,
                    *, spend: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            asked = loop.time()
            grant = await ask(size, seconds)
            self._install(key, Lease(grant, asked, seconds, spent=1 if spend else 0))
        finally:
            if done is not None:
                del self._asking[key]
                done.set_result(None)

    async def _renew(self, key: Key, size: int, seconds: float, ask: Ask, done: asyncio.Future[None]) -> None:
        try:
            await self._take(key, size, seconds, ask, done, spend=False)
        except (ValetkeyError, RedisError, OSError) as exc:  # the held lease runs out; then requests ask
            log.debug('{"event":"budget_lease_not_renewed","type":"%s"}', type(exc).__name__)

    def _install(self, key: Key, lease: Lease) -> None:
        old = self._held.get(key)
        self._held[key] = lease
        if old is not None:
            self._give_back(old)
        asyncio.get_running_loop().call_later(lease.seconds, self._expire, key, lease)

    def _expire(self, key: Key, lease: Lease) -> None:
        if self._held.get(key) is lease:
            del self._held[key]
            self._give_back(lease)

    def _give_back(self, lease: Lease) -> None:
        grant, unspent = lease.grant, lease.grant.granted - lease.spent
        lease.spent = grant.granted  # nothing more is spent from it
        if unspent > 0:
            self._background(self._returned(grant, grant.granted - unspent + 1))

    async def _returned(self, grant: Grant, first: int) -> None:
        with contextlib.suppress(RedisError, OSError):  # not given back: they pass with the period
            await grant.give_back(grant.member, first, grant.granted)

    def _background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)
