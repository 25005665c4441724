"""Every issued credential that may still be valid, so the passthrough scanner refuses a request
carrying one back (``credential_passthrough``, pattern ``issued_credential``).

Two sets, because no secret goes to Redis (Vault is the only secret store):

- **this process's values**, exact: a request holding one anywhere (in any form the scanner
  decodes: raw, percent-decoded, Basic, JSON strings) is refused, whichever upstream or
  destination of the process it is sent to (the egress proxy shares one set across its gateways);
- **every replica's digests**, mirrored from Redis: each process publishes the SHA-256 of each
  value it issues (``valetkey:issued``, a sorted set of ``<length>:<hex digest>`` scored by
  expiry) and reads everyone's every ``tick`` seconds. Another replica, or an HTTP gateway for a
  database password the Postgres gateway issued, hashes each token-shaped run of the request of a
  published length (``_RUNS``: the credential delimited by anything else, as in a header, a query
  or a JSON string) and refuses a match. The digest of a random credential of 100+ bits reveals
  nothing of it. Staleness: one ``tick`` (a credential reaches a sandbox only through a response
  of the replica that issued it, which knows it at once).

A value stays known until it is revoked, or until it expires when revoking it failed or a shared
token (OAuth2) was replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from ahocorasick_rs import BytesAhoCorasick
from redis.exceptions import RedisError

from contract import keys
from contract.tasks import stop_task
from gateways.sources.base import IssuedCredential

log = logging.getLogger("valetkey.gateway")
KEY = keys.ISSUED
MIN_LENGTH = 8  # as the scanner's held secrets: shorter values would refuse ordinary text
VALID_MARGIN = 60.0  # seconds a value stays known past its expiry (clock skew with the upstream)
# a token-shaped run: base64url and the punctuation opaque tokens, JWTs and base64 use
_TOKEN_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~+/=-")
_SHAPE = bytes(ord("a") if b in _TOKEN_BYTES else ord(" ") for b in range(256))
_PIECES = re.compile(rb"[A-Za-z0-9_~-]+")
_SPLITS = b"=./+"


def _digest(value: bytes) -> str:
    return f"{len(value)}:{hashlib.sha256(value).hexdigest()}"


class IssuedValues:
    def __init__(self, redis: aioredis.Redis | None, *, tick: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self._tick = tick
        self._clock = clock
        self._values: dict[bytes, float] = {}  # value -> until
        self._automaton: BytesAhoCorasick | None = None
        self._digests: frozenset[str] = frozenset()  # every replica's, as last read
        self._lengths: frozenset[int] = frozenset()
        self._shortest = 0  # the shortest published value's length
        self._writes: set[asyncio.Task[None]] = set()
        self._last: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"IssuedValues(local={len(self._values)}, published={len(self._digests)})"

    def add(self, credential: IssuedCredential) -> None:
        value = credential.value.reveal().encode()
        if len(value) < MIN_LENGTH:
            return
        until = credential.expires_at + VALID_MARGIN
        self._values[value] = until
        self._rebuild()
        self._write(lambda r: r.zadd(KEY, {_digest(value): until}))

    def discard(self, credential: IssuedCredential) -> None:
        """Revoked: no longer valid anywhere."""
        value = credential.value.reveal().encode()
        if self._values.pop(value, None) is not None:
            self._rebuild()
            self._write(lambda r: r.zrem(KEY, _digest(value)))

    def find(self, data: bytes) -> bool:
        """Does ``data`` hold a value issued here, or a token-shaped run another replica issued?"""
        if self._automaton is not None and self._automaton.find_matches_as_indexes(data):
            return True
        if not self._lengths:
            return False
        # runs of token characters at least as long as the shortest published value, found at
        # C speed: the first occurrence of that many token characters starts a run
        shape = data.translate(_SHAPE)
        needle = b"a" * self._shortest
        start = shape.find(needle)
        while start >= 0:
            end = shape.find(b" ", start)
            end = len(data) if end < 0 else end
            run = data[start:end]
            if self._known(run):
                return True
            # a run holding "=", ".", "+" or "/": the value of a "name=value" in it, and its
            # base64url-only pieces (a JWT's parts are pieces; the JWT whole is the run)
            if len(run.translate(None, _SPLITS)) != len(run) and (
                    self._known(run.partition(b"=")[2]) or any(map(self._known, _PIECES.findall(run)))):
                return True
            start = shape.find(needle, end)
        return False

    def _known(self, candidate: bytes) -> bool:
        return len(candidate) in self._lengths and _digest(candidate) in self._digests

    def prune(self) -> None:
        now = self._clock()
        expired = [v for v, until in self._values.items() if until < now]
        for value in expired:
            del self._values[value]
        if expired:
            self._rebuild()

    def _rebuild(self) -> None:
        # a few hundred values build in well under a millisecond (Rust, no regex compile)
        self._automaton = BytesAhoCorasick(list(self._values)) if self._values else None

    def _write(self, command: Callable[[aioredis.Redis], Awaitable[object]]) -> None:
        if self._redis is None:
            return
        task = asyncio.create_task(self._send(command, self._last))
        self._last = task
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _send(self, command: Callable[[aioredis.Redis], Awaitable[object]],
                    after: asyncio.Task[None] | None) -> None:
        if after is not None:  # in order: a revocation never lands before its issuance
            await asyncio.wait([after])
        if self._redis is None:
            return
        try:
            await command(self._redis)
        except RedisError as exc:  # the next add or the expiry cleans up; this replica knows it
            log.warning('{"event":"issued_publish_failed","type":"%s"}', type(exc).__name__)

    async def refresh(self) -> None:
        """Read every replica's digests (and drop the expired ones from Redis)."""
        self.prune()
        if self._redis is None:
            return
        now = self._clock()
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(KEY, "-inf", now)
            pipe.zrangebyscore(KEY, now, "+inf")
            _, members = await pipe.execute()
        digests = frozenset(m.decode() if isinstance(m, bytes) else m for m in members)
        self._digests = digests
        self._lengths = frozenset(int(d.split(":", 1)[0]) for d in digests)
        self._shortest = min(self._lengths, default=0)

    async def start(self) -> None:
        with contextlib.suppress(RedisError):
            await self.refresh()
        self._task = asyncio.create_task(self._run(), name="issued-values")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=2.0)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            try:
                await self.refresh()
            except RedisError as exc:
                log.warning('{"event":"issued_refresh_failed","type":"%s"}', type(exc).__name__)
