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
for (and no call shortens the window's life). A lease is spent only within ``SPEND_WITHIN`` of
its lifetime, measured from before the ask (Redis's clock reads later than that, as long as the
two clocks run at the same rate), then given back: its unspent requests leave the window and the
total, once (``_GIVE_BACK`` forgets the lease as it does), also when a renewal replaces it. The
script call is a task of its own: a request cancelled while it asks leaks no lease.

What it costs: while a replica holds unspent requests, another replica can be refused up to that
many requests before the limit (``size - 1``, or ``2 * size - 1`` while a renewal overlaps the
lease it replaces, per other replica and purpose, for at most one lease's lifetime). So only
generous limits lease: one leased request per ``PER_REQUEST`` of the limit (``"120 per 1m"``
leases 3, ``"600 per 1m"`` 16, ``"30 per 1m"`` none), at most ``MAX_SIZE``, and never where a
bytes-out total applies (bytes are known only after each response). A lease lives
``LEASE_SECONDS``, or a quarter of a short rate period. A process gives its leases back as it
stops (``close``); one that dies holding a lease gives nothing back: its requests leave the
window with the period and stay in the total.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from redis.exceptions import RedisError

from contract.errors import ValetkeyError
from policies.model import Purpose, Upstream

log = logging.getLogger("valetkey.gateway")
LEASE_SECONDS = 1.0
MIN_SECONDS = 0.05  # a rate period too short for a lease this long is charged request by request
SPEND_WITHIN = 0.8  # of a lease's lifetime, from before the ask: its requests are spent in this
RENEW_AT = 0.5  # a lease half spent, or half its lifetime gone, is renewed in the background
MAX_SIZE = 16
CLOSE_WITHIN = 2.0  # seconds a stopping process waits for its give-backs
PER_REQUEST = 32  # of the limit, per leased request

Key = tuple[str, str]  # (run, purpose)
_T = TypeVar("_T")


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
    """What Redis granted: ``granted`` requests; ``give_back(unspent)`` returns the unspent ones
    (once: the script forgets the lease as it does)."""

    granted: int
    give_back: Callable[[int], Awaitable[object]]


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


Ask = Callable[[int, float], Coroutine[Any, Any, Grant]]


class Leases:
    """The leases of one gateway process for one upstream, by (run, purpose)."""

    def __init__(self) -> None:
        self._closed = False
        self._held: dict[Key, Lease] = {}
        # the ask in flight per key; its result is the refusal it met (waiters raise it), or None
        self._asking: dict[Key, asyncio.Future[ValetkeyError | None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._held)

    async def spend(self, key: Key, size: int, seconds: float, ask: Ask) -> None:
        """One request from the held lease; else wait for the ask in flight (twice at most) and
        share its refusal; else ask for a lease, or for this one request alone while another ask
        is in flight (so one process asks for one lease at a time per run and purpose, and a burst
        is not refused early by leases it took for itself). A refusal or an unavailable Redis is
        raised by ``ask`` as for a request without a lease."""
        loop = asyncio.get_running_loop()
        for attempt in range(3):
            lease = self._held.get(key)
            if lease is not None and lease.usable(loop.time()):
                lease.spent += 1
                if lease.due(loop.time()) and key not in self._asking:
                    self._ask(key, size, seconds, ask, claim=[False])  # renewed in the background
                return
            asking = self._asking.get(key)
            if asking is None or attempt == 2:
                break
            refusal = await asyncio.shield(asking)
            if refusal is not None:
                raise refusal
        if key in self._asking:
            await ask(1, 0.0)
            return
        claim = [True]  # this request takes the grant's first request, unless it is cancelled first
        try:
            await asyncio.shield(self._ask(key, size, seconds, ask, claim))
        except asyncio.CancelledError:
            claim[0] = False  # the grant, when it comes, is installed unspent and given back in time
            raise

    def _ask(self, key: Key, size: int, seconds: float, ask: Ask, claim: list[bool]) -> asyncio.Task[Grant]:
        """The script call for a lease, as a task of its own: what it grants is installed (and so
        given back in time) even when the request that asked was cancelled meanwhile."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[ValetkeyError | None] = loop.create_future()
        self._asking[key] = done
        task = self._start(ask(size, seconds))
        task.add_done_callback(partial(self._granted, key, loop.time(), seconds, done, claim))
        return task

    def _start(self, work: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)
        return task

    def _granted(self, key: Key, asked: float, seconds: float, done: asyncio.Future[ValetkeyError | None],
                 claim: list[bool], task: asyncio.Task[Grant]) -> None:
        refusal: ValetkeyError | None = None
        error = None if task.cancelled() else task.exception()  # retrieved: never "unhandled"
        if error is not None:
            refusal = error if isinstance(error, ValetkeyError) else None
            log.debug('{"event":"budget_lease_not_granted","type":"%s"}', type(error).__name__)
        elif not task.cancelled():
            self._install(key, Lease(task.result(), asked, seconds, spent=1 if claim[0] else 0))
        if self._asking.get(key) is done:
            del self._asking[key]
        done.set_result(refusal)

    async def close(self) -> None:
        """Give back every held lease, and what an ask still in flight grants, waiting at most
        ``CLOSE_WITHIN`` for those calls: a stopping process leaves its unspent requests to the
        other replicas rather than to the end of the window."""
        self._closed = True
        for key, lease in list(self._held.items()):
            del self._held[key]
            self._give_back(lease)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WITHIN):
                while self._tasks:  # a grant arriving now is given back at once, adding a task
                    await asyncio.gather(*self._tasks, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _install(self, key: Key, lease: Lease) -> None:
        if self._closed:
            self._give_back(lease)
            return
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
            self._start(self._returned(grant, unspent))

    @staticmethod
    async def _returned(grant: Grant, unspent: int) -> None:
        try:
            await grant.give_back(unspent)
        except (RedisError, OSError) as exc:  # not given back: they pass with the period
            log.warning('{"event":"budget_lease_not_given_back","unspent":%d,"type":"%s"}', unspent,
                        type(exc).__name__)
