"""The per-run credential cache against a scripted source: one issuance per run, refresh ahead of
expiry, revocation at run end and by the reaper, failures with their reason codes, no value in
any log or repr, forms built off the event loop."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from contract.claims import AccessClaims, GrantClaim
from contract.errors import Reason, UpstreamError, ValetkeyError
from contract.secret import Secret
from gateways.sources import cache as cache_module
from gateways.sources.base import IssuedCredential, refused, unavailable
from gateways.sources.cache import RunCredentials
from gateways.sources.metrics import SourceMetrics

NOW = 1_800_000_000.0


def sync(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in its own event loop (the suite has no async plugin)."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))
    return run


@dataclass
class Clock:
    now: float = NOW

    def __call__(self) -> float:
        return self.now


@dataclass
class Scripted:
    kind: str = "test_token"
    shared: bool = False
    lifetime: float = 100.0
    clock: Clock = field(default_factory=Clock)
    fail: ValetkeyError | None = None
    delay: float = 0.0
    issued: int = 0
    refreshed: int = 0
    revoked: list[str] = field(default_factory=list)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def issue(self, claims: AccessClaims) -> IssuedCredential:
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        self.issued += 1
        value = f"tok-{claims.sub}-{self.issued}-{'x' * 24}"
        return IssuedCredential(Secret(value), self.kind, f"n{self.issued}", self.clock() + self.lifetime)

    async def refresh(self, claims: AccessClaims, current: IssuedCredential) -> IssuedCredential:
        self.refreshed += 1
        return await self.issue(claims)

    async def revoke(self, credential: IssuedCredential) -> None:
        self.revoked.append(credential.value.reveal())


def claims(run: str = "run-1", exp: float = NOW + 600) -> AccessClaims:
    return AccessClaims(iss="i", sub=run, aud="up", exp=int(exp), nbf=0, iat=0, jti="j", client_id="rt",
                        grants=(GrantClaim("p", {}),))


def make(source: Scripted) -> tuple[RunCredentials[tuple[str, ...]], CollectorRegistry, list[int]]:
    builds: list[int] = []  # how many values each forms build was for

    async def forms(values: tuple[Secret, ...]) -> tuple[str, ...]:
        builds.append(len(values))
        await asyncio.sleep(0)  # built in steps on the loop (Redactor.build)
        return tuple(v.reveal() for v in values)

    registry = CollectorRegistry()
    return RunCredentials(source, "up", SourceMetrics(registry), forms, clock=source.clock), registry, builds


def sample(registry: CollectorRegistry, name: str, result: str) -> float:
    return registry.get_sample_value(f"valetkey_gateway_credential_{name}_total",
                                     {"upstream": "up", "kind": "test_token", "result": result}) or 0.0


@sync
async def test_one_issuance_per_run_shared_by_concurrent_requests() -> None:
    source = Scripted(delay=0.05)
    cache, registry, builds = make(source)
    held = await asyncio.gather(*(cache.get(claims()) for _ in range(20)))
    assert source.issued == 1
    assert len({id(h) for h in held}) == 1
    assert (await cache.get(claims())) is held[0]
    assert builds == [1]  # one forms build, for the one value, shared by all 20
    assert sample(registry, "issued", "ok") == 1.0
    other = await cache.get(claims("run-2"))
    assert other.credential.value != held[0].credential.value
    assert source.issued == 2


@sync
async def test_refresh_ahead_keeps_the_old_value_in_the_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "REPLACED_GRACE", 0.0)
    source = Scripted(lifetime=100.0)
    cache, registry, _ = make(source)
    first = await cache.get(claims())
    await cache.sweep()
    assert source.refreshed == 0  # 100 s left: nothing to do
    source.clock.now += 80  # 20 s left, under a quarter of the lifetime
    await cache.sweep()
    fresh = await cache.get(claims())
    assert source.refreshed == 1
    assert fresh.credential.value != first.credential.value
    assert fresh.forms == (fresh.credential.value.reveal(), first.credential.value.reveal())
    await asyncio.sleep(0.01)
    assert source.revoked == [first.credential.value.reveal()]  # the replaced one, after its grace
    assert sample(registry, "refreshed", "ok") == 1.0


@sync
async def test_short_lived_refreshes_at_half_its_life() -> None:
    source = Scripted(lifetime=4.0)
    cache, _, _ = make(source)
    await cache.get(claims())
    source.clock.now += 1.5
    await cache.sweep()
    assert source.refreshed == 0
    source.clock.now += 0.6
    await cache.sweep()
    assert source.refreshed == 1


@sync
async def test_end_run_revokes_and_refuses_a_new_issue() -> None:
    source = Scripted()
    cache, registry, _ = make(source)
    held = await cache.get(claims())
    cache.end_run("run-1")
    await asyncio.sleep(0.01)
    assert source.revoked == [held.credential.value.reveal()]
    with pytest.raises(ValetkeyError) as info:
        await cache.get(claims())
    assert info.value.code == Reason.TOKEN_REVOKED.value
    assert sample(registry, "revoked", "ok") == 1.0


@sync
async def test_end_runs_covers_by_predicate_and_the_reaper_takes_expired_or_revoked_runs() -> None:
    source = Scripted(lifetime=10_000)
    cache, _, _ = make(source)
    a = await cache.get(claims("a"))
    b = await cache.get(claims("b", exp=NOW + 5))
    c = await cache.get(claims("c"))
    cache.end_runs(lambda cl: cl.sub == "a")
    cache.revoked = lambda cl: cl.sub == "c"  # a revocation we did not hear live (resync)
    source.clock.now += 5 + 61  # b's token expired beyond the leeway
    await cache.sweep()
    await asyncio.sleep(0.01)
    assert sorted(source.revoked) == sorted(h.credential.value.reveal() for h in (a, b, c))
    assert cache.held("a") is None
    assert cache.held("b") is None
    assert cache.held("c") is None


@pytest.mark.parametrize(("fail", "code", "status"), [
    pytest.param(unavailable("x"), "credential_source_unavailable", 503, id="unreachable"),
    pytest.param(refused("x", 422), "credential_source_refused", 502, id="refused"),
])
@sync
async def test_issue_failures_keep_their_code_and_retry_next_time(fail: ValetkeyError, code: str,
                                                                  status: int) -> None:
    source = Scripted(fail=fail)
    cache, registry, _ = make(source)
    with pytest.raises(ValetkeyError) as info:
        await cache.get(claims())
    assert (info.value.code, info.value.status) == (code, status)
    assert sample(registry, "issued", code) == 1.0
    source.fail = None
    assert (await cache.get(claims())).credential.id == "n1"


@sync
async def test_issue_timeout_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "ISSUE_TIMEOUT", 0.05)
    cache, _, _ = make(Scripted(delay=1.0))
    with pytest.raises(ValetkeyError) as info:
        await cache.get(claims())
    assert info.value.code == Reason.CREDENTIAL_SOURCE_UNAVAILABLE.value


@sync
async def test_refresh_failure_keeps_serving_until_expiry(caplog: pytest.LogCaptureFixture) -> None:
    source = Scripted(lifetime=100)
    cache, registry, _ = make(source)
    held = await cache.get(claims())
    source.fail = UpstreamError("down", Reason.CREDENTIAL_SOURCE_REFUSED)
    source.clock.now += 90
    with caplog.at_level(logging.INFO, logger="valetkey.gateway"):
        await cache.sweep()
    assert (await cache.get(claims())) is held
    assert sample(registry, "refreshed", "credential_source_refused") == 1.0
    assert "credential_refresh_failed" in caplog.text
    assert held.credential.value.reveal() not in caplog.text


@sync
async def test_shared_source_one_entry_never_revoked_per_run() -> None:
    source = Scripted(shared=True)
    cache, _, _ = make(source)
    a, b = await cache.get(claims("a")), await cache.get(claims("b"))
    assert a is b
    cache.end_run("a")
    await asyncio.sleep(0.01)
    assert source.revoked == []
    assert (await cache.get(claims("b"))) is a


@sync
async def test_refresh_now_once_for_many_and_stop_revokes(caplog: pytest.LogCaptureFixture) -> None:
    source = Scripted()
    cache, _, _ = make(source)
    held = await cache.get(claims())
    with caplog.at_level(logging.INFO, logger="valetkey.gateway"):
        fresh = await asyncio.gather(*(cache.refresh_now(claims(), held.credential) for _ in range(5)))
        assert source.refreshed == 1
        assert len({h.credential.value.reveal() for h in fresh}) == 1
        await cache.stop()
    assert fresh[0].credential.value.reveal() in source.revoked
    assert "tok-" not in caplog.text
    assert "tok-" not in repr(cache)
    assert "tok-" not in repr(fresh[0])


@sync
async def test_a_late_prewarm_never_displaces_what_a_request_holds() -> None:
    """The run's record may arrive after its first request issued: warming then does nothing, and
    a credential replaced because its grants differ is revoked only after the grace (a request
    may be carrying it upstream)."""
    source = Scripted()
    cache, _, _ = make(source)
    first = await cache.get(claims())
    other_grants = AccessClaims(iss="i", sub="run-1", aud="up", exp=int(NOW + 600), nbf=0, iat=0, jti="j",
                                client_id="rt", grants=(GrantClaim("q", {}),))
    await cache.warm(other_grants)
    assert source.issued == 1
    assert cache.held("run-1") is first
    await cache.warm(claims("run-2"))  # nothing held yet: issued ahead
    assert source.issued == 2
    replaced = await cache.get(other_grants)  # a request whose grants differ: issued for them
    assert replaced.credential.value != first.credential.value
    await asyncio.sleep(0.05)
    assert first.credential.value.reveal() not in source.revoked  # not before the grace
    await cache.stop()
