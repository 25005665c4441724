"""A gateway's revocation watcher and the generation marker (contract/generation.py), on a real
Redis of its own: no marker, no start and no fresh state; a lost hash is written back from memory;
budgets refuse runs older than the generation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from contract import generation
from contract.claims import AccessClaims
from contract.errors import Reason, Unavailable
from contract.revocations import HASH, RevocationStore, Scope, new_revocation
from gateways import revocation_watcher
from gateways.budget import Budgets
from gateways.revocation_watcher import RevocationWatcher
from tests.support.gateway_stack import Stack
from valetkey.dev.services import RedisServer


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


def run(redis_url: str, scenario: Callable[[aioredis.Redis], Awaitable[None]]) -> None:
    async def wrapped() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.flushall()
            await scenario(client)
        finally:
            await client.aclose()
    asyncio.run(wrapped())


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def test_no_marker_no_start(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(revocation_watcher, "START_TIMEOUT", 1.0)

    async def scenario(client: aioredis.Redis) -> None:
        watcher = RevocationWatcher(client, require_generation=True, heartbeat=0.1)
        with pytest.raises(TimeoutError):
            await watcher.start()
        assert not watcher.fresh
        await watcher.stop()

    run(redis_url, scenario)


def test_lost_hash_is_written_back_and_state_is_stale_until_restored(redis_url: str) -> None:
    async def scenario(client: aioredis.Redis) -> None:
        await generation.establish(client)
        record = new_revocation(Scope.RUNTIME, "tester", "admin", "test")
        await RevocationStore(client).put(record)
        watcher = RevocationWatcher(client, require_generation=True, heartbeat=0.1)
        await watcher.start()
        try:
            assert watcher.fresh
            before = watcher.generation
            await client.flushall()  # the data is lost; no broker restores it here

            async def stale_and_written_back() -> bool:
                return not watcher.fresh and bool(await client.hexists(HASH, record.key))
            await until(stale_and_written_back)
            assert watcher.generation_since() is None
            restored = await generation.establish(client)  # what a broker does after its restore

            async def fresh() -> bool:
                return watcher.fresh
            await until(fresh)
            assert watcher.generation == restored
            assert before is not None
            assert restored.id != before.id
            assert watcher.reasserted >= 1
        finally:
            await watcher.stop()

    run(redis_url, scenario)


@pytest.mark.parametrize(("since", "iat_offset", "reason"), [
    pytest.param(None, 0, Reason.BUDGET_STATE_LOST, id="generation-unknown"),
    pytest.param(1000.0, -1, Reason.BUDGET_STATE_LOST, id="run-older-than-generation"),
    pytest.param(1000.0, 0, None, id="run-of-this-generation"),
])
def test_budgets_refuse_runs_older_than_the_generation(
        redis_url: str, gateway_stack: Stack, since: float | None, iat_offset: int, reason: Reason | None,
) -> None:
    upstream = gateway_stack.policies.upstreams["echo"]
    purpose = upstream.purposes["limited"]
    claims: Any = AccessClaims.new(issuer="i", run_id=f"run_{time.time_ns()}", audience="echo",
                                   runtime="tester", grants=[], now=1000 + iat_offset, ttl=3600)

    async def scenario(client: aioredis.Redis) -> None:
        budgets = Budgets(client, upstream, since=lambda: since)
        if reason is None:
            await budgets.charge(claims, purpose, now=1000.0)
            return
        with pytest.raises(Unavailable) as refused:
            await budgets.charge(claims, purpose, now=1000.0)
        assert refused.value.reason is reason

    run(redis_url, scenario)
