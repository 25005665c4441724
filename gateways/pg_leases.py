"""Each run's database lease at one Postgres gateway: issued at the run's first session, shared
by its later sessions, renewed ahead of expiry while the run lives, revoked when it ends.

``get`` is the session path: a held lease is a dict lookup; the first session of a run waits for
the issuance (one per run however many sessions start at once). A background loop, every
``tick`` seconds and in memory, revokes the lease of a run that a revocation covers (``run end``
writes one too) or whose token expired, and renews the others when ``refresh_ahead`` of their
lifetime is left (never past the run's expiry). A lease nobody renews, because its gateway
died, ends at its own TTL (the Vault role's ``default_ttl``, minutes): Vault runs the revocation
statements then, so leftovers are reaped without us.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from contract.claims import AccessClaims
from contract.errors import ValetkeyError
from contract.tasks import stop_task
from gateways.revocation_watcher import RevocationWatcher
from gateways.sources.base import IssuedCredential
from gateways.sources.metrics import SourceMetrics
from gateways.sources.vault_database import VaultDatabase

log = logging.getLogger("valetkey.gateway")
STOP_TIMEOUT = 5.0
# a run's sessions end at its token's expiry with the gateway's own ``run_expired``; its lease is
# revoked this long after, so the database's "terminating connection" does not arrive first
EXPIRY_GRACE = 2.0


@dataclass
class HeldLease:
    claims: AccessClaims
    credential: IssuedCredential
    issued_at: float


class RunLeases:
    def __init__(self, source: VaultDatabase, upstream: str, revocations: RevocationWatcher,
                 metrics: SourceMetrics, *, tick: float = 1.0, refresh_ahead: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self._upstream = upstream
        self._revocations = revocations
        self._metrics = metrics
        self._tick = tick
        self._ahead = refresh_ahead
        self._clock = clock
        self._held: dict[str, HeldLease] = {}
        self._issuing: dict[str, asyncio.Task[HeldLease]] = {}
        self._task: asyncio.Task[None] | None = None
        self.issued = self.renewed = self.revoked = self.failed = 0

    def __repr__(self) -> str:
        return f"RunLeases(upstream={self._upstream!r}, held={len(self._held)})"

    def held(self, run_id: str) -> HeldLease | None:
        return self._held.get(run_id)

    async def get(self, claims: AccessClaims) -> HeldLease:
        held = self._held.get(claims.sub)
        if held is not None and held.credential.expires_at > self._clock():
            return held
        task = self._issuing.get(claims.sub)
        if task is None:
            task = self._issuing[claims.sub] = asyncio.create_task(self._issue(claims), name="pg-lease")
            task.add_done_callback(lambda _: self._issuing.pop(claims.sub, None))
        return await asyncio.shield(task)

    async def _issue(self, claims: AccessClaims) -> HeldLease:
        started = self._clock()
        try:
            credential = await self.source.issue(claims)
        except ValetkeyError as exc:
            self.failed += 1
            self._count(self._metrics.issued, exc.code)
            self._event("lease_issue_failed", claims.sub, reason=exc.code)
            raise
        held = self._held[claims.sub] = HeldLease(claims, credential, self._clock())
        self.issued += 1
        self._count(self._metrics.issued, "ok")
        self._metrics.issue_seconds.labels(self._upstream, self.source.kind).observe(self._clock() - started)
        self._event("lease_issued", claims.sub, credential, ms=round((self._clock() - started) * 1000, 1))
        if self._revocations.state.find(claims) is not None:  # revoked while Vault was issuing
            await self.end_run(claims.sub)
        return held

    async def end_run(self, run_id: str) -> None:
        """Revoke the run's lease (its sessions end, its database user is dropped) and forget it."""
        held = self._held.pop(run_id, None)
        if held is None:
            return
        try:
            await self.source.revoke(held.credential)
        except ValetkeyError as exc:
            self.failed += 1  # the lease still ends at its TTL; try again on the next tick
            self._count(self._metrics.revoked, exc.code)
            self._held.setdefault(run_id, held)
            self._event("lease_revoke_failed", run_id, held.credential, reason=exc.code)
            return
        self.revoked += 1
        self._count(self._metrics.revoked, "ok")
        self._event("lease_revoked", run_id, held.credential)

    async def sweep(self) -> None:
        """One pass of the background loop (tests call it directly)."""
        now = self._clock()
        for run_id, held in list(self._held.items()):
            if self._revocations.state.find(held.claims) is not None or held.claims.exp + EXPIRY_GRACE <= now:
                await self.end_run(run_id)
                continue
            life = held.credential.expires_at - held.issued_at
            if held.credential.expires_at - now <= max(self._tick * 2, life * self._ahead):
                try:
                    credential = await self.source.refresh(held.claims, held.credential)
                except ValetkeyError as exc:
                    self.failed += 1
                    self._count(self._metrics.refreshed, exc.code)
                    self._event("lease_renew_failed", run_id, held.credential, reason=exc.code)
                    continue
                self._count(self._metrics.refreshed, "ok")
                if run_id in self._held:
                    self._held[run_id] = HeldLease(held.claims, credential, self._clock())
                    self.renewed += 1

    async def start(self) -> None:
        await self.source.start()
        self._task = asyncio.create_task(self._run(), name="pg-leases")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        with contextlib.suppress(TimeoutError):  # what is left ends at its TTL
            async with asyncio.timeout(STOP_TIMEOUT):
                for run_id in list(self._held):
                    await self.end_run(run_id)
        await self.source.stop()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            try:
                await self.sweep()
            except Exception as exc:
                log.warning('{"event": "lease_sweep_failed", "error": "%s"}', type(exc).__name__)

    def _count(self, counter: Counter, result: str) -> None:
        counter.labels(self._upstream, self.source.kind, result).inc()

    def _event(self, event: str, run: str, credential: IssuedCredential | None = None,
               **fields: object) -> None:
        line: dict[str, object] = {"event": event, "upstream": self._upstream, "run": run, **fields}
        if credential is not None:  # the kind and the lease id, never the password
            line.update(kind=credential.kind, lease=credential.id, user=credential.username,
                        expires=int(credential.expires_at))
        log.info(json.dumps(line, sort_keys=True))
