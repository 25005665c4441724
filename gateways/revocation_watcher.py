"""A gateway's live copy of the revocation state, kept fresh over Redis pub/sub.

One background task holds a subscription to the revocation channel. On (re)connect it subscribes
first and then reloads the whole hash, so no change published in between is missed. It pings on
the subscribed connection every ``heartbeat`` seconds; any answer confirms freshness. The request
path calls ``check()``: in memory, no I/O. If freshness cannot be confirmed for ``max_stale``
seconds the gateway refuses every request with ``revocation_state_stale`` until Redis is back.

Streams in flight are registered here; when a revocation arrives that covers one, its task is
cancelled, which cuts the response within the propagation time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract.claims import AccessClaims
from contract.errors import Reason, Unavailable, ValetkeyError
from contract.revocations import CHANNEL, Revocation, RevocationSet, RevocationStore
from contract.tasks import stop_task

log = logging.getLogger("valetkey.gateway")
START_TIMEOUT = 10.0


class RevocationWatcher:
    def __init__(
        self,
        client: aioredis.Redis,
        *,
        max_stale: float = 3.0,
        heartbeat: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = client
        self._store = RevocationStore(client)
        self._max_stale = max_stale
        self._heartbeat = heartbeat
        self._clock = clock
        self.state = RevocationSet()
        self._confirmed = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._streams: dict[asyncio.Task[Any], tuple[AccessClaims, str]] = {}
        self.applied = 0  # revocation messages applied (tests and the propagation benchmark)

    @property
    def fresh(self) -> bool:
        return self._clock() - self._confirmed <= self._max_stale

    def check(self, claims: AccessClaims, target: str = "") -> None:
        """The request-path check: fail closed when stale, else the in-memory rule. ``target``:
        the upstream or destination the egress proxy is asked to reach (revocable by name too)."""
        if not self.fresh:
            raise Unavailable("revocation state cannot be confirmed fresh; refusing until it is",
                              Reason.REVOCATION_STATE_STALE)
        self.state.check(claims, target)

    async def run_check(self, claims: AccessClaims) -> None:
        self.check(claims)

    def track(self, claims: AccessClaims, target: str = "") -> Callable[[], None]:
        """Register the current task as a stream of ``claims`` (used at ``target``: the egress
        proxy's tunnels, cut when that destination is revoked too); returns the unregister call."""
        task = asyncio.current_task()
        if task is None:
            return lambda: None
        self._streams[task] = (claims, target)
        current = task

        def untrack() -> None:
            self._streams.pop(current, None)

        return untrack

    async def start(self) -> None:
        """Start watching; returns once the first full load succeeded (bounded by START_TIMEOUT)."""
        self._task = asyncio.create_task(self._run(), name="revocation-watcher")
        async with asyncio.timeout(START_TIMEOUT):
            await self._ready.wait()

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    def _apply(self, record: Revocation) -> None:
        self.state.apply(record)
        self.applied += 1
        for task, (claims, target) in list(self._streams.items()):
            if record.covers(claims, target) and not task.done():
                task.cancel(f"revoked:{record.key}")

    async def _run(self) -> None:
        delay = 0.05
        while True:
            try:
                await self._session()
            except (RedisError, OSError, ValetkeyError, ValueError, TypeError, KeyError) as exc:
                # a malformed message also lands here: reconnecting reloads the whole hash
                log.warning('{"event":"revocation_watch_lost","error":"%s"}', type(exc).__name__)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _session(self) -> None:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(CHANNEL)
            self.state.merge(await self._store.load())
            self.state.forget_expired(time.time())
            for task, (claims, target) in list(self._streams.items()):  # cut streams revoked while away
                if self.state.find(claims, target) is not None and not task.done():
                    task.cancel("revoked")
            self._confirmed = self._clock()
            self._ready.set()
            last_ping = self._clock()
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self._heartbeat)
                now = self._clock()
                if message is not None:
                    self._confirmed = now
                    if message.get("type") == "message":
                        self._apply(Revocation.from_json(message["data"]))
                if now - last_ping >= self._heartbeat:
                    await pubsub.ping()
                    last_ping = now
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
