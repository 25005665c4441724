"""Admission control: a bounded number of requests served at once, a bounded queue before them,
and a fast ``503 broker_overloaded`` with ``Retry-After`` beyond it.

Wraps the broker's application; only requests that ``match`` (``POST /v1/runs``) are counted.
Everything else — ``/healthz``, ``/readyz``, the JWKS, the security team's routes — passes
straight through and never waits behind a mint. A refused request is answered before its body is
read or its caller looked up in Vault, so a refusal costs microseconds, and the work the broker
does take on stays within what Vault, Redis and its pools can serve. Without a bound, every
waiting mint holds a Redis and a Vault connection slot and each of them times out together.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from contract.errors import Overloaded

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER = 1  # seconds: a burst drains in about that at the broker's mint rate
LOG_EVERY = 5.0  # seconds between two "mints_shed" log lines while refusing
log = logging.getLogger("valetkey.broker")


def is_mint(scope: Scope) -> bool:
    return scope.get("method") == "POST" and scope.get("path") == "/v1/runs"


class Admission:
    """``concurrency`` matching requests at once; ``queue`` more wait at most ``wait`` seconds."""

    def __init__(self, app: ASGIApp, *, concurrency: int, queue: int, wait: float,
                 match: Callable[[Scope], bool] = is_mint) -> None:
        if concurrency < 1 or queue < 0 or wait <= 0:
            raise ValueError("admission needs concurrency >= 1, queue >= 0 and wait > 0")
        self.app = app
        self.concurrency = concurrency
        self.queue = queue
        self.wait = wait
        self._match = match
        self._slots: asyncio.Semaphore | None = None  # made in the server's event loop
        self.active = 0
        self.waiting = 0
        self.shed = 0  # refused since start (tests, the log line)
        self._logged_at = 0.0
        self._logged_shed = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._match(scope):
            await self.app(scope, receive, send)
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        if self._slots.locked():
            if self.waiting >= self.queue:
                await self._refuse(send, "the broker is at its mint capacity and its queue is full")
                return
            self.waiting += 1
            try:
                async with asyncio.timeout(self.wait):
                    await self._slots.acquire()
            except TimeoutError:
                await self._refuse(send, f"no mint slot came free within {self.wait:g}s")
                return
            finally:
                self.waiting -= 1
        else:
            await self._slots.acquire()
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
            self._slots.release()

    async def _refuse(self, send: Send, detail: str) -> None:
        self.shed += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY:  # one line per interval, not one per refusal
            log.warning(json.dumps({"event": "mints_shed", "refused": self.shed - self._logged_shed,
                                    "active": self.active, "waiting": self.waiting}))
            self._logged_at, self._logged_shed = now, self.shed
        error = Overloaded(f"{detail}; retry in {RETRY_AFTER}s", RETRY_AFTER)
        body = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store"),
                   *((k.encode(), v.encode()) for k, v in error.headers.items())]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
