"""Issue a run's credential when the broker creates the run, off the request path.

The broker appends ``run_created`` (run id, runtime, grants, expiry) to the audit stream. This
task reads new entries (``XREAD`` from the moment it starts) and, for a run granted purposes at
this upstream, asks the per-run cache for its credential with claims rebuilt from the record; the
run's first request then finds it issued and its redaction forms built. Nothing here is needed
for correctness: a missed entry (Redis away, the gateway started later) only means the first
request issues. The cache re-issues if a request's verified grants differ from the record's, so
an entry written by someone else cannot widen what a run's credential was issued for.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract.audit_stream import STREAM
from contract.claims import AccessClaims, GrantClaim, params_view
from contract.errors import ValetkeyError
from contract.tasks import stop_task
from gateways.sources.cache import RunCredentials

log = logging.getLogger("valetkey.gateway")
BLOCK_MS = 1000
CONCURRENT = 2  # issuances (and forms builds) at once: a burst of runs must not starve requests


def claims_of(line: dict[str, Any], upstream: str) -> AccessClaims | None:
    """The claims a run's token at ``upstream`` carries, from its ``run_created`` record."""
    if line.get("event") != "run_created":
        return None
    grants = tuple(GrantClaim(str(g["purpose"]), params_view({str(k): str(v) for k, v in
                                                              (g.get("params") or {}).items()}))
                   for g in line.get("grants", []) if isinstance(g, dict) and g.get("upstream") == upstream)
    if not grants:
        return None
    return AccessClaims(iss="", sub=str(line["run"]), aud=upstream, exp=int(line["expires"]), nbf=0,
                        iat=0, jti="", client_id=str(line.get("runtime", "")), grants=grants)


class Prewarm:
    def __init__(self, redis: aioredis.Redis, credentials: RunCredentials[Any], upstream: str) -> None:
        self._redis = redis
        self._credentials = credentials
        self._upstream = upstream
        self._task: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(CONCURRENT)
        self._pending: set[asyncio.Task[None]] = set()
        self.warmed = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"credential-prewarm:{self._upstream}")

    async def stop(self) -> None:
        await stop_task(self._task)
        for task in list(self._pending):
            await stop_task(task)

    async def _run(self) -> None:
        last = "$"
        while True:
            try:
                answer: Any = await self._redis.xread({STREAM: last}, count=100, block=BLOCK_MS)
            except (RedisError, OSError) as exc:
                log.warning('{"event":"credential_prewarm_lost","error":"%s"}', type(exc).__name__)
                await asyncio.sleep(1.0)
                continue
            for _, entries in answer or []:
                for entry_id, fields in entries:
                    last = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                    self._consider(fields)

    def _consider(self, fields: dict[Any, Any]) -> None:
        if fields.get(b"kind", fields.get("kind")) not in (b"run", "run"):
            return
        try:
            line = json.loads(fields.get(b"line", fields.get("line", b"{}")))
            claims = claims_of(line, self._upstream)
        except (ValueError, KeyError, TypeError):
            return
        if claims is not None:
            task = asyncio.create_task(self._warm(claims))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _warm(self, claims: AccessClaims) -> None:
        async with self._slots:
            try:
                await self._credentials.warm(claims)
            except ValetkeyError as exc:  # counted by the cache; the first request will try again
                log.info('{"event":"credential_prewarm_failed","run":"%s","reason":"%s"}',
                         claims.sub, exc.code)
                return
        self.warmed += 1
