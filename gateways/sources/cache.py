"""Each run's credential from one source: issued on the run's first request, cached for the run,
refreshed ahead of expiry in the background, revoked when the run ends.

The request path calls ``get``: a cached credential costs a dict lookup. The first request of a
run waits for the issuance (one call per run however many requests arrive at once: they share
it) and for the credential's redaction forms (``forms``: built in steps on the event loop, which
keeps serving every other run; the credential is handed out only once they are ready, so its
first use is redacted). A refresh replaces the credential before it expires (``refresh_ahead``
of its lifetime, at least ``MIN_AHEAD`` seconds); the value it replaces stays in the forms, so an
echo of the old one is still redacted. ``end_run`` (a run ended or revoked: the revocation
watcher calls it) revokes the run's credential; the background loop also reaps the credentials of
runs whose token expired and nobody ended. A shared source (OAuth2) has one entry for every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from prometheus_client import Counter

from contract.claims import MAX_LEEWAY, AccessClaims
from contract.errors import Reason, TokenInvalid, ValetkeyError
from contract.secret import Secret
from contract.tasks import stop_task
from gateways.sources.base import IssuedCredential, RunCredentialSource, unavailable
from gateways.sources.issued import IssuedValues
from gateways.sources.metrics import SourceMetrics

log = logging.getLogger("valetkey.gateway")
F = TypeVar("F")
SHARED = "*"  # the one key of a shared source
ISSUE_TIMEOUT = 15.0  # seconds an issuance or refresh may take before credential_source_unavailable
MIN_AHEAD = 5.0  # refresh at least this many seconds before expiry
EXPIRY_MARGIN = 1.0  # a credential this close to expiry is not handed to a new request
REPLACED_GRACE = 30.0  # seconds a replaced per-run credential stays valid for requests in flight
STOP_TIMEOUT = 5.0  # seconds given to revoking what is held when the gateway stops


@dataclass(frozen=True)
class Held(Generic[F]):
    """A run's credential, when it was issued, and the redaction forms of it (and the value it
    replaced, if any)."""

    claims: AccessClaims
    credential: IssuedCredential
    issued_at: float
    forms: F = field(repr=False)  # built from the values: never printed


def _grants(claims: AccessClaims) -> frozenset[tuple[str, tuple[tuple[str, str], ...]]]:
    return frozenset((g.purpose, tuple(sorted(g.params.items()))) for g in claims.grants)


class RunCredentials(Generic[F]):
    def __init__(self, source: RunCredentialSource, upstream: str, metrics: SourceMetrics,
                 forms: Callable[[tuple[Secret, ...]], Awaitable[F]], *, refresh_ahead: float = 0.25,
                 tick: float = 1.0, clock: Callable[[], float] = time.time,
                 issued: IssuedValues | None = None) -> None:
        self.source = source
        self._upstream = upstream
        self._metrics = metrics
        self._forms = forms
        self._ahead = refresh_ahead
        self._tick = tick
        self._clock = clock
        self._issued = issued  # what the passthrough scanner refuses (until revoked or expired)
        self._held: dict[str, Held[F]] = {}
        self._pending: dict[str, asyncio.Task[Held[F]]] = {}
        self._ended: dict[str, float] = {}  # run id -> when to forget it was ended
        self._background: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        # is this run revoked now? (the gateway's revocation state; the sweep ends such runs)
        self.revoked: Callable[[AccessClaims], bool] = lambda claims: False

    def __repr__(self) -> str:
        return f"RunCredentials(kind={self.source.kind!r}, held={len(self._held)})"

    def _key(self, claims: AccessClaims) -> str:
        return SHARED if self.source.shared else claims.sub

    def held(self, run_id: str) -> Held[F] | None:
        return self._held.get(SHARED if self.source.shared else run_id)

    async def get(self, claims: AccessClaims) -> Held[F]:
        """The run's credential (request path). Reasons: credential_source_unavailable,
        credential_source_refused, token_revoked (the run ended while it was issued)."""
        key = self._key(claims)
        held = self._held.get(key)
        same = held is not None and (self.source.shared or _grants(held.claims) == _grants(claims))
        if held is not None and same and held.credential.expires_at > self._clock() + EXPIRY_MARGIN:
            return held
        if held is not None and same and held.credential.expires_at > self._clock():
            # about to expire and the background refresh fell behind: this request waits for it
            task = self._pending.get(key) or self._start(key, self._refresh(key, held, held.claims))
            with contextlib.suppress(ValetkeyError):
                return await asyncio.shield(task)
            return held  # the refresh failed: what is still valid serves until it expires
        if held is not None and not same:
            # issued for other grants (ahead, from the run's record): issue for this token; the
            # old one is revoked after the grace, as a refresh does (a request may be using it)
            del self._held[key]
            self._spawn(self._revoke(key, held.credential, after=REPLACED_GRACE))
        if key in self._ended:
            raise TokenInvalid("the run has ended", check="revoked", reason=Reason.TOKEN_REVOKED)
        task = self._pending.get(key) or self._start(key, self._issue(key, claims))
        held = await asyncio.shield(task)  # a client going away does not abort the issuance
        if not self.source.shared and _grants(held.claims) != _grants(claims):
            return await self.get(claims)  # it was issued ahead for other grants: replaced above
        return held

    async def warm(self, claims: AccessClaims) -> None:
        """Issue ahead (the prewarm, from the run's record), only when nothing is held or being
        issued for the run: a request's own issuance is never displaced by a late record."""
        key = self._key(claims)
        if key in self._held or key in self._pending or key in self._ended:
            return
        await self.get(claims)

    async def refresh_now(self, claims: AccessClaims, failed: IssuedCredential) -> Held[F]:
        """After the upstream refused ``failed`` as expired: a new one, once (another request that
        saw the same refusal gets the same new credential)."""
        key = self._key(claims)
        held = self._held.get(key)
        if held is not None and held.credential is not failed:
            return held
        task = self._pending.get(key) or self._start(key, self._refresh(key, held, claims))
        return await asyncio.shield(task)

    def refresh_soon(self, claims: AccessClaims, failed: IssuedCredential) -> None:
        """The upstream refused ``failed`` on a request that is not sent again: refresh in the
        background, so the run's next request carries a new one."""
        self._spawn(self._refresh_quietly(claims, failed))

    async def _refresh_quietly(self, claims: AccessClaims, failed: IssuedCredential) -> None:
        with contextlib.suppress(ValetkeyError):  # counted in the metrics by _refresh
            await self.refresh_now(claims, failed)

    def _start(self, key: str, work: Coroutine[Any, Any, Held[F]]) -> asyncio.Task[Held[F]]:
        """One issuance or refresh per key at a time; everyone asking meanwhile shares it."""
        task = self._pending[key] = asyncio.create_task(work)

        def done(_: asyncio.Task[Held[F]]) -> None:
            if self._pending.get(key) is task:
                del self._pending[key]
            if not task.cancelled():
                task.exception()  # retrieved: a failure nobody awaited is not logged as lost

        task.add_done_callback(done)
        return task

    async def _issue(self, key: str, claims: AccessClaims) -> Held[F]:
        kind, started = self.source.kind, time.perf_counter()
        try:
            async with asyncio.timeout(ISSUE_TIMEOUT):
                credential = await self.source.issue(claims)
        except TimeoutError:
            self._count(self._metrics.issued, Reason.CREDENTIAL_SOURCE_UNAVAILABLE.value)
            raise unavailable(f"issuing a {kind}") from None
        except ValetkeyError as exc:
            self._count(self._metrics.issued, exc.code)
            raise
        if self._issued is not None:
            self._issued.add(credential)
        forms = await self._forms((credential.value,))
        held = Held(claims, credential, self._clock(), forms)
        self._metrics.issue_seconds.labels(self._upstream, kind).observe(time.perf_counter() - started)
        self._count(self._metrics.issued, "ok")
        self._event("credential_issued", key, credential)
        if key in self._ended:  # ended while it was being issued: take it back at once
            self._spawn(self._revoke(key, credential))
            raise TokenInvalid("the run has ended", check="revoked", reason=Reason.TOKEN_REVOKED)
        self._held[key] = held
        return held

    async def _refresh(self, key: str, held: Held[F] | None, claims: AccessClaims) -> Held[F]:
        if held is None:
            return await self._issue(key, claims)
        old = held.credential
        try:
            async with asyncio.timeout(ISSUE_TIMEOUT):
                new = await self.source.refresh(held.claims, old)
        except TimeoutError:
            self._count(self._metrics.refreshed, Reason.CREDENTIAL_SOURCE_UNAVAILABLE.value)
            raise unavailable(f"refreshing a {self.source.kind}") from None
        except ValetkeyError as exc:
            self._count(self._metrics.refreshed, exc.code)
            raise
        if self._issued is not None:
            self._issued.add(new)
        values = (new.value,) if new.value == old.value else (new.value, old.value)
        forms = held.forms if values == (old.value,) else await self._forms(values)
        fresh = Held(held.claims, new, self._clock(), forms)
        self._count(self._metrics.refreshed, "ok")
        self._event("credential_refreshed", key, new)
        if not self.source.shared and new.value != old.value:  # requests in flight may still use it
            self._spawn(self._revoke(key, old, after=REPLACED_GRACE))
        if self._held.get(key) is held:
            self._held[key] = fresh
        return fresh

    def end_runs(self, covered: Callable[[AccessClaims], bool]) -> None:
        """A revocation arrived: end every run it covers (the revocation watcher calls this)."""
        for key, held in list(self._held.items()):
            if key != SHARED and covered(held.claims):
                self.end_run(key)

    def end_run(self, run_id: str) -> None:
        """The run ended or was revoked: forget its credential and revoke it in the background."""
        if self.source.shared:
            return
        held = self._held.pop(run_id, None)
        until = held.claims.exp if held is not None else self._clock() + ISSUE_TIMEOUT
        self._ended[run_id] = max(until, self._clock()) + MAX_LEEWAY
        if held is not None:
            self._spawn(self._revoke(run_id, held.credential))

    async def _revoke(self, key: str, credential: IssuedCredential, after: float = 0.0) -> None:
        if after:
            await asyncio.sleep(after)
        try:
            async with asyncio.timeout(ISSUE_TIMEOUT):
                await self.source.revoke(credential)
        except (TimeoutError, ValetkeyError) as exc:
            code = (exc.code if isinstance(exc, ValetkeyError)
                    else Reason.CREDENTIAL_SOURCE_UNAVAILABLE.value)
            self._count(self._metrics.revoked, code)
            log.warning('{"event":"credential_revoke_failed","upstream":"%s","kind":"%s","id":"%s",'
                        '"run":"%s","reason":"%s"}', self._upstream, credential.kind, credential.id,
                        key, code)
            return
        self._count(self._metrics.revoked, "ok")
        self._event("credential_revoked", key, credential)
        if self._issued is not None:
            self._issued.discard(credential)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _count(self, counter: Counter, result: str) -> None:
        counter.labels(self._upstream, self.source.kind, result).inc()

    def _event(self, event: str, key: str, credential: IssuedCredential) -> None:
        log.info('{"event":"%s","upstream":"%s","kind":"%s","id":"%s","run":"%s"}',
                 event, self._upstream, credential.kind, credential.id, key)

    async def start(self) -> None:
        await self.source.start()
        self._task = asyncio.create_task(self._run(), name=f"run-credentials:{self._upstream}")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        held, self._held = self._held, {}
        revokes = [asyncio.create_task(self._revoke(key, h.credential))
                   for key, h in held.items() if key != SHARED]
        if revokes:
            await asyncio.wait(revokes, timeout=STOP_TIMEOUT)
        for task in [*revokes, *self._background]:  # a replaced one's delayed revocation included
            await stop_task(task)
        await self.source.stop()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            try:
                await self.sweep()
            except Exception as exc:  # the refresher never dies silently
                log.warning('{"event":"credential_sweep_failed","type":"%s"}', type(exc).__name__)

    async def sweep(self) -> None:
        """One pass: reap runs whose token expired, refresh what expires soon."""
        now = self._clock()
        self._ended = {k: t for k, t in self._ended.items() if t > now}
        for key, held in list(self._held.items()):
            if key != SHARED and (held.claims.exp + MAX_LEEWAY < now or self.revoked(held.claims)):
                self.end_run(key)  # the reaper: a run that expired, or whose end we did not hear
                continue
            lifetime = held.credential.expires_at - held.issued_at
            ahead = min(max(MIN_AHEAD, lifetime * self._ahead), lifetime / 2)  # short-lived: at half
            if held.credential.expires_at - now > ahead:
                continue
            if key in self._pending:
                continue
            task = self._start(key, self._refresh(key, held, held.claims))
            try:
                await asyncio.shield(task)
            except ValetkeyError as exc:
                log.warning('{"event":"credential_refresh_failed","upstream":"%s","kind":"%s",'
                            '"run":"%s","reason":"%s"}', self._upstream, self.source.kind, key, exc.code)
