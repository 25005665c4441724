"""Waiting for a person without a thread: one subscription per process, one event per held request.

``ApprovalWaiter`` holds one Redis subscription to ``valetkey:approvals`` (ids only) and wakes the
held request whose id arrives; whatever wakes it, the request re-reads its record through
``ApprovalStore.settle`` (the one atomic step that consumes an approval). It also polls, with a
backoff from 0.25 s to 5 s, so a message lost while the subscription reconnects costs at most one
poll interval, and after a reconnection every waiter is woken at once. A held request costs an
``asyncio.Event`` and its buffered body: no thread, no task of its own beyond the client watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract.approvals import CHANNEL, ApprovalStore, PendingApproval
from contract.tasks import stop_task

log = logging.getLogger("valetkey.gateway")
POLL_FIRST, POLL_MAX = 0.25, 5.0


class ApprovalWaiter:
    def __init__(self, client: aioredis.Redis, max_held: int) -> None:
        self._redis = client
        self.store = ApprovalStore(client)
        self.max_held = max_held
        self._events: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> int:
        return len(self._events)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="approval-watcher")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def wait(self, approval: PendingApproval, gone: asyncio.Event) -> str:
        """Until the record is decided, its deadline passes or ``gone`` is set (the client hung
        up): ``approved`` (consumed, once), ``denied``, ``timeout``, ``cancelled``."""
        event = self._events[approval.id] = asyncio.Event()
        poll = POLL_FIRST
        try:
            while True:
                event.clear()
                if gone.is_set():
                    return await self.store.settle(approval, "cancelled", "client disconnected")
                state = await self.store.settle(approval)
                if state != "pending":
                    return state
                remaining = approval.deadline - time.time()
                if remaining <= 0:  # an approval recorded at the last moment still wins
                    return await self.store.settle(approval, "timeout", "gateway")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(poll, remaining)):
                        await event.wait()
                poll = min(poll * 2, POLL_MAX)
        finally:
            self._events.pop(approval.id, None)

    def wake(self, approval_id: str) -> None:
        event = self._events.get(approval_id)
        if event is not None:
            event.set()

    async def _run(self) -> None:
        delay = 0.05
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(CHANNEL)
                for event in list(self._events.values()):  # anything missed while away
                    event.set()
                delay = 0.05
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        self.wake(data.decode() if isinstance(data, bytes) else str(data))
            except (RedisError, OSError) as exc:
                log.warning('{"event":"approval_watch_lost","error":"%s"}', type(exc).__name__)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
