"""A gateway's live copy of the revocation state, kept fresh over Redis pub/sub.

One background task holds a subscription to the revocation channel. On (re)connect it subscribes
first and then reloads the whole hash, so no change published in between is missed. It pings on
the subscribed connection every ``heartbeat`` seconds; any answer confirms freshness. The request
path calls ``check()``: in memory, no I/O. If freshness cannot be confirmed for ``max_stale``
seconds the gateway refuses every request with ``revocation_state_stale`` until Redis is back.

With ``require_generation`` (every real gateway) the state is fresh only while the generation
marker is present (``contract/generation.py``): after Redis lost its data the gateway refuses
until a broker has restored the durable copy, and it never starts on a Redis without the marker,
so a new replica cannot accept a run revoked before the loss. On every resync, and whenever the
marker disappears or changes, the records held in memory that Redis lacks are written back
(``HSETNX``, never over a newer record).

Streams in flight are registered here; when a revocation arrives that covers one, its task is
cancelled, which cuts the response within the propagation time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract import generation
from contract.claims import AccessClaims
from contract.errors import Reason, Unavailable, ValetkeyError
from contract.generation import Generation
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
        require_generation: bool = False,
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
        # called with each revocation applied (run-scoped credentials end the runs it covers)
        self.listeners: list[Callable[[Revocation], None]] = []
        self._require_generation = require_generation
        self.generation: Generation | None = None  # the marker as last read
        self.reasserted = 0  # records written back into Redis (tests, the log)

    @property
    def fresh(self) -> bool:
        if self._require_generation and self.generation is None:
            return False
        return self._clock() - self._confirmed <= self._max_stale

    def generation_since(self) -> float | None:
        """When the current generation of Redis data began (None: unknown, nothing trusted)."""
        if self.generation is None:
            return None if self._require_generation else 0.0
        return self.generation.since

    def check(self, claims: AccessClaims, target: str = "") -> None:
        """The request-path check: fail closed when stale, else the in-memory rule. ``target``:
        the upstream or destination the egress proxy is asked to reach (revocable by name too)."""
        if not self.fresh:
            raise Unavailable("revocation state cannot be confirmed fresh; refusing until it is",
                              Reason.REVOCATION_STATE_STALE)
        self.state.check(claims, target)

    async def run_check(self, claims: AccessClaims) -> None:
        self.check(claims)

    def revoked(self, claims: AccessClaims) -> bool:
        """Does the last known state deny ``claims``? (no freshness check: for the reaper)"""
        return self.state.find(claims) is not None

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
        for listener in self.listeners:
            listener(record)
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
            await self._resync()
            self._confirmed = self._clock()
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
                    if _changed(self.generation, await generation.read(self._redis)):
                        await self._resync()
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _resync(self) -> None:
        """Reload the hash (keeping what Redis no longer has), write back what it lacks, learn the
        generation, cut streams revoked while away."""
        current = await generation.read(self._redis)
        loaded = await self._store.load()
        if self.generation is not None and _changed(self.generation, current):
            log.warning(json.dumps({"event": "redis_data_loss_detected", "held": len(self.state),
                                    "in_redis": len(loaded)}))
        self.state.merge(loaded)
        self.state.forget_expired(time.time())
        missing = {r.key: r.to_json() for r in self.state.records() if r.key not in loaded}
        if missing:
            self.reasserted += await self._store.restore(missing)
        self.generation = current
        for task, (claims, target) in list(self._streams.items()):
            if self.state.find(claims, target) is not None and not task.done():
                task.cancel("revoked")
        if current is not None or not self._require_generation:
            self._ready.set()


def _changed(before: Generation | None, now: Generation | None) -> bool:
    return (before is None) != (now is None) or (before is not None and now is not None
                                                  and before.id != now.id)
