"""Budgets in a real Redis: a rate limit counts each request once, whether or not Redis still
holds the script (the batch sends EVALSHA alone and loads the script only on NOSCRIPT)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from contract.claims import AccessClaims
from contract.errors import Reason, TooManyRequests
from gateways.budget import Budgets
from policies import model
from valetkey.dev.services import RedisServer

LIMITED = model.Purpose(name="limited", why="A rate-limited read.", methods=frozenset({"GET"}),
                        paths=(model.PathTemplate.parse("/v1/limited"),), params=(),
                        limits=model.Limits(rate=model.Rate(3, 60)))
UPSTREAM = model.Upstream(
    name="echo", base_url="http://echo.test", scheme="http", host="echo.test", port=80,
    secret=model.SecretRef(mount="secret", path="echo", field="token"),
    injection=model.Injection(model.Placement.HEADER, header="Authorization", format="Bearer {secret}"),
    env=model.SandboxEnv(placeholder="ECHO_TOKEN", base_url="ECHO_URL"), purposes={"limited": LIMITED})


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


@pytest.mark.parametrize("flush_before", [
    pytest.param(set(), id="script-stays-loaded"),
    pytest.param({0}, id="no-script-in-redis-yet"),
    pytest.param({2}, id="scripts-flushed-between-calls"),
    pytest.param({0, 1, 2, 3}, id="flushed-before-every-call"),
])
def test_each_request_is_counted_once(redis_url: str, flush_before: set[int]) -> None:
    claims: Any = AccessClaims.new(issuer="i", run_id=f"run_{time.time_ns()}", audience="echo",
                                   runtime="tester", grants=[], now=int(time.time()), ttl=3600)
    outcomes: list[str] = []

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            budgets = Budgets(client, UPSTREAM)
            for i in range(4):
                if i in flush_before:
                    await client.script_flush()
                try:
                    await budgets.charge(claims, LIMITED, time.time())
                    outcomes.append("ok")
                except TooManyRequests as exc:
                    outcomes.append(exc.code)
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert outcomes == ["ok", "ok", "ok", Reason.BUDGET_EXCEEDED.value]


def test_concurrent_calls_after_a_flush_share_one_batch(redis_url: str) -> None:
    """Calls made in one event-loop turn go as one pipeline; after a flush every one of them gets
    NOSCRIPT, and every one runs again exactly once."""
    claims: Any = AccessClaims.new(issuer="i", run_id=f"run_{time.time_ns()}", audience="echo",
                                   runtime="tester", grants=[], now=int(time.time()), ttl=3600)

    async def scenario() -> list[str]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.script_flush()
            budgets = Budgets(client, UPSTREAM)
            results = await asyncio.gather(*(budgets.charge(claims, LIMITED, time.time()) for _ in range(5)),
                                           return_exceptions=True)
            return ["ok" if r is None else getattr(r, "code", repr(r)) for r in results]
        finally:
            await client.aclose()

    assert sorted(asyncio.run(scenario())) == ["budget_exceeded", "budget_exceeded", "ok", "ok", "ok"]
