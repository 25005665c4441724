"""Budget leases in a real Redis (``gateways/budget_lease.py``): which limits lease, that a
limit is never exceeded by one process or by two, that a lease's requests enter the window at
the end of its life and what it did not spend goes back, and that a request spends from the
lease without a Redis call."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from contract import keys
from contract.claims import AccessClaims
from contract.errors import Reason, Unavailable, ValetkeyError
from gateways import budget_lease
from gateways.budget import Budgets
from gateways.budget_lease import lease_terms
from policies import model
from valetkey.dev.services import RedisServer


def purpose(rate: model.Rate | None) -> model.Purpose:
    return model.Purpose(name="write", why="Write items.", methods=frozenset({"POST"}),
                         paths=(model.PathTemplate.parse("/v1/items"),), params=(),
                         limits=model.Limits(rate=rate))


def upstream(p: model.Purpose, limits: model.RunLimits | None = None) -> model.Upstream:
    return model.Upstream(
        name="echo", base_url="http://echo.test", scheme="http", host="echo.test", port=80,
        secret=model.SecretRef(mount="secret", path="echo", field="token"),
        injection=model.Injection(model.Placement.HEADER, header="Authorization", format="Bearer {secret}"),
        env=model.SandboxEnv(placeholder="ECHO_TOKEN", base_url="ECHO_URL"), purposes={p.name: p},
        run_limits=limits or model.RunLimits())


@pytest.mark.parametrize(("rate", "limits", "terms"), [
    pytest.param(model.Rate(5, 60), None, (1, 0.0), id="5-per-minute-one-at-a-time"),
    pytest.param(model.Rate(63, 60), None, (1, 0.0), id="63-per-minute-one-at-a-time"),
    pytest.param(model.Rate(120, 60), None, (3, 1.0), id="120-per-minute-leases-3"),
    pytest.param(model.Rate(600, 60), None, (16, 1.0), id="600-per-minute-leases-16-at-most"),
    pytest.param(model.Rate(10**8, 60), None, (16, 1.0), id="huge-rate-16-at-most"),
    pytest.param(model.Rate(1000, 2), None, (16, 0.5), id="short-period-shorter-lease"),
    pytest.param(model.Rate(1000, 0), None, (1, 0.0), id="period-too-short-for-a-lease"),
    pytest.param(None, model.RunLimits(requests=2000), (16, 1.0), id="request-total-only"),
    pytest.param(model.Rate(600, 60), model.RunLimits(requests=100), (3, 1.0), id="small-total-caps-it"),
    pytest.param(model.Rate(600, 60), model.RunLimits(bytes_out=1 << 20), (1, 0.0), id="bytes-total-never-leases"),
])
def test_which_limits_lease(rate: model.Rate | None, limits: model.RunLimits | None,
                            terms: tuple[int, float]) -> None:
    p = purpose(rate)
    assert lease_terms(p, upstream(p, limits)) == terms


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


def new_claims() -> Any:
    return AccessClaims.new(issuer="i", run_id=f"run_{time.time_ns()}", audience="echo", runtime="tester",
                            grants=[], now=int(time.time()), ttl=3600)


@contextlib.asynccontextmanager
async def budgets_on(url: str, up: model.Upstream,
                     since: Callable[[], float | None] = lambda: 0.0) -> AsyncIterator[tuple[Budgets, aioredis.Redis]]:
    """One process's ``Budgets`` on its own client; closed (leases given back) at the end."""
    client = aioredis.Redis.from_url(url)
    budgets = Budgets(client, up, since=since)
    try:
        yield budgets, client
    finally:
        await budgets.close()
        await client.aclose()


async def outcome(budgets: Budgets, claims: Any, p: model.Purpose) -> str:
    try:
        await budgets.charge(claims, p, time.time())
    except ValetkeyError as exc:
        return exc.code
    return "ok"


async def script_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


@pytest.mark.parametrize(("rate", "limits", "limit", "refusal"), [
    pytest.param(model.Rate(320, 60), None, 320, "rate limit", id="rate"),
    pytest.param(None, model.RunLimits(requests=320), 320, "request total", id="request-total"),
    pytest.param(model.Rate(400, 60), model.RunLimits(requests=320), 320, "request total", id="both-total-first"),
])
def test_one_process_spends_exactly_the_limit_with_few_calls(redis_url: str, rate: model.Rate | None,
                                                            limits: model.RunLimits | None, limit: int,
                                                            refusal: str) -> None:
    p = purpose(rate)
    up = upstream(p, limits)

    async def scenario() -> tuple[list[str], int, str]:
        async with budgets_on(redis_url, up) as (budgets, client):
            claims = new_claims()
            before = await script_calls(client)
            results = [await outcome(budgets, claims, p) for _ in range(limit + 3)]
            calls = await script_calls(client) - before
            try:
                await budgets.charge(claims, p, time.time())
                detail = ""
            except ValetkeyError as exc:
                detail = str(exc)
            return results, calls, detail

    results, calls, detail = asyncio.run(scenario())
    assert results == ["ok"] * limit + ["budget_exceeded"] * 3
    assert refusal in detail
    assert calls <= limit // 4  # leases of 10: a call (and a give-back) per ~5 requests, not one each


def test_two_replicas_never_exceed_and_refuse_early_only_by_the_unspent(redis_url: str) -> None:
    """Two processes' Budgets (two replicas) spend one run's "320 per 1m" at once: never more
    than 320, at most one lease's unspent requests refused early, and once the leases have been
    given back the run can spend exactly up to 320 in all."""
    p = purpose(model.Rate(320, 60))
    up = upstream(p)
    size, seconds = lease_terms(p, up)

    async def scenario() -> tuple[int, int]:
        clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
        try:
            replicas, claims = [Budgets(c, up) for c in clients], new_claims()
            first = await asyncio.gather(*(outcome(replicas[i % 2], claims, p) for i in range(400)))
            await asyncio.sleep(seconds + 0.2)  # every lease expired and given back
            later = [await outcome(replicas[i % 2], claims, p) for i in range(400)]
            return first.count("ok"), first.count("ok") + later.count("ok")
        finally:
            for r in replicas:
                await r.close()
            for c in clients:
                await c.aclose()

    at_once, in_all = asyncio.run(scenario())
    assert 320 - 2 * size <= at_once <= 320
    assert in_all == 320


def test_a_lease_enters_the_window_at_its_end_and_gives_back_what_it_did_not_spend(redis_url: str) -> None:
    p = purpose(model.Rate(320, 60))
    up = upstream(p, model.RunLimits(requests=1000))
    size, seconds = lease_terms(p, up)

    async def scenario() -> tuple[list[float], float, int, int, int]:
        async with budgets_on(redis_url, up) as (budgets, client):
            claims = new_claims()
            run = keys.budget(claims.sub, up.name)
            window, total = f"{run}:rate:{p.name}", f"{run}:requests"
            redis_now = await client.time()
            await budgets.charge(claims, p, time.time())
            scores = [s for _, s in await client.zrange(window, 0, -1, withscores=True)]
            held = int(await client.get(total) or 0)
            await asyncio.sleep(seconds + 0.3)
            return (scores, redis_now[0] * 1000 + redis_now[1] / 1000, held,
                    await client.zcard(window), int(await client.get(total) or 0))

    scores, redis_ms, held, window_after, total_after = asyncio.run(scenario())
    assert len(scores) == size  # the whole lease counted at once
    assert held == size
    assert all(s >= redis_ms + seconds * 1000 - 1 for s in scores)  # stamped at the end of its life
    assert (window_after, total_after) == (1, 1)  # the unspent went back; the one spent stays


def test_a_request_spends_from_the_lease_without_a_redis_call() -> None:
    """Once a lease is held, Redis going away does not stall or refuse the requests it covers;
    after its spending window they are refused redis_unavailable (fail closed, no waiting)."""
    p = purpose(model.Rate(600, 60))
    up = upstream(p)
    size, seconds = lease_terms(p, up)

    async def scenario(server: RedisServer) -> tuple[list[str], float]:
        client = aioredis.Redis.from_url(server.url, socket_connect_timeout=0.5, socket_timeout=0.5)
        budgets, claims = Budgets(client, up), new_claims()
        try:
            first = await outcome(budgets, claims, p)
            server.stop()
            started = time.perf_counter()
            held = [await outcome(budgets, claims, p) for _ in range(size // 2 - 1)]
            spent_in = time.perf_counter() - started
            await asyncio.sleep(seconds * budget_lease.SPEND_WITHIN + 0.05)
            return [first, *held, await outcome(budgets, claims, p)], spent_in
        finally:
            await budgets.close()
            await client.aclose()

    with RedisServer() as server:
        results, spent_in = asyncio.run(scenario(server))
    assert results == ["ok"] * (size // 2) + ["redis_unavailable"]
    assert spent_in < 0.1  # from memory: no connection attempted


def test_leases_are_forgotten_after_their_life(redis_url: str) -> None:
    p = purpose(model.Rate(600, 60))
    up = upstream(p)
    _, seconds = lease_terms(p, up)

    async def scenario() -> tuple[int, int]:
        async with budgets_on(redis_url, up) as (budgets, _client):
            for _ in range(20):
                await budgets.charge(new_claims(), p, time.time())
            held = len(budgets._leases)
            await asyncio.sleep(seconds + 0.2)
            return held, len(budgets._leases)

    assert asyncio.run(scenario()) == (20, 0)


def test_a_renewal_refused_leaves_the_held_lease_to_run_out(redis_url: str) -> None:
    """A limit reached while a lease is held: its remaining requests are spent, then refused."""
    p = purpose(model.Rate(64, 60))  # leases of 2
    up = upstream(p)

    async def scenario() -> list[str]:
        async with budgets_on(redis_url, up) as (budgets, _client):
            claims = new_claims()
            return [await outcome(budgets, claims, p) for _ in range(66)]

    assert asyncio.run(scenario()) == ["ok"] * 64 + ["budget_exceeded"] * 2



def test_a_one_off_call_never_shortens_the_window_under_a_lease(redis_url: str) -> None:
    """A lease stamps its requests at the end of its life; a later one-request call (made while
    another ask is in flight, or by another replica) must not cut the window's life short, or
    the lease's spent requests would leave it early and the run could exceed its limit."""
    p = purpose(model.Rate(512, 2))
    up = upstream(p)
    size, seconds = lease_terms(p, up)

    async def scenario() -> tuple[int, int]:
        async with budgets_on(redis_url, up) as (budgets, client):
            claims = new_claims()
            window = f"{keys.budget(claims.sub, up.name)}:rate:{p.name}"
            await budgets._ask(claims, p, size, seconds)  # a lease: stamped now + lease
            await budgets._ask(claims, p, 1, 0.0)  # then one request alone
            return await client.pttl(window), round((2 + seconds) * 1000)

    pttl, needed = asyncio.run(scenario())
    assert pttl >= needed - 100


def test_a_give_back_sent_twice_gives_back_once(redis_url: str) -> None:
    """A retry of the give-back (its answer lost) must not give the requests back again."""
    p = purpose(model.Rate(600, 60))
    up = upstream(p, model.RunLimits(requests=1000))
    size, seconds = lease_terms(p, up)

    async def scenario() -> tuple[int, int, int]:
        async with budgets_on(redis_url, up) as (budgets, client):
            claims = new_claims()
            run = keys.budget(claims.sub, up.name)
            grant = await budgets._ask(claims, p, size, seconds)
            first = await grant.give_back(size - 1)
            again = await grant.give_back(size - 1)
            return int(str(first)), int(str(again)), int(await client.get(f"{run}:requests") or 0)

    assert asyncio.run(scenario()) == (size - 1, 0, 1)


def test_a_request_cancelled_while_it_asks_leaks_no_lease(redis_url: str) -> None:
    """The client goes away while its charge's script call is on the wire: what Redis granted is
    installed unspent and given back in time, so nothing stays counted for a request never made."""
    p = purpose(None)
    up = upstream(p, model.RunLimits(requests=2000))
    _, seconds = lease_terms(p, up)

    async def scenario() -> int:
        async with budgets_on(redis_url, up) as (budgets, client):
            claims = new_claims()
            for _ in range(5):
                task = asyncio.create_task(budgets.charge(claims, p, time.time()))
                await asyncio.sleep(0)
                await asyncio.sleep(0)  # the script call is sent
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(seconds + 0.3)  # every lease expired and given back
            return int(await client.get(f"{keys.budget(claims.sub, up.name)}:requests") or 0)

    assert asyncio.run(scenario()) == 0


def test_waiters_share_the_refusal_of_the_ask_they_waited_on() -> None:
    """Redis unreachable (an ask that hangs, then fails): fifty concurrent requests are all
    refused redis_unavailable within about one ask, not one ask after another."""
    async def hang_then_fail(wanted: int, seconds: float) -> budget_lease.Grant:
        await asyncio.sleep(0.3)
        raise Unavailable("budget state unavailable: TimeoutError", Reason.REDIS_UNAVAILABLE)

    async def scenario() -> tuple[list[str], float]:
        leases = budget_lease.Leases()

        async def one() -> str:
            try:
                await leases.spend(("run", "write"), 16, 1.0, hang_then_fail)
            except ValetkeyError as exc:
                return exc.code
            return "ok"

        started = time.perf_counter()
        codes = await asyncio.gather(*(one() for _ in range(50)))
        return codes, time.perf_counter() - started

    codes, took = asyncio.run(scenario())
    assert codes == ["redis_unavailable"] * 50
    assert took < 0.55  # one hung ask (0.3 s) and the one-request asks sent meanwhile, not 3 in a row


def test_a_renewal_cancelled_before_it_runs_leaves_no_ask_behind() -> None:
    async def grant(wanted: int, seconds: float) -> budget_lease.Grant:
        async def give_back(unspent: int) -> object:
            return unspent
        return budget_lease.Grant(wanted, give_back)

    async def scenario() -> tuple[int, str]:
        leases = budget_lease.Leases()
        key = ("run", "write")
        await leases.spend(key, 4, 1.0, grant)
        await leases.spend(key, 4, 1.0, grant)  # half spent: a renewal is asked in the background
        for task in list(leases._tasks):
            task.cancel()
        await asyncio.sleep(0.01)
        left = len(leases._asking)
        await leases.spend(key, 4, 1.0, grant)  # neither stuck nor refused
        return left, "ok"

    assert asyncio.run(scenario()) == (0, "ok")


def test_budget_state_lost_refuses_although_a_lease_is_held(redis_url: str) -> None:
    p = purpose(model.Rate(600, 60))
    up = upstream(p)
    since: list[float | None] = [0.0]

    async def scenario() -> list[str]:
        async with budgets_on(redis_url, up, since=lambda: since[0]) as (budgets, _client):
            claims = new_claims()
            first = await outcome(budgets, claims, p)
            since[0] = time.time() + 5  # Redis lost its data after this run was minted
            return [first, await outcome(budgets, claims, p)]

    assert asyncio.run(scenario()) == ["ok", "budget_state_lost"]


def test_a_stopping_process_gives_its_leases_back(redis_url: str) -> None:
    """``Budgets.close`` (gateway shutdown): the held lease's unspent requests go back at once,
    not at the end of the lease's life, so the other replicas can spend them."""
    p = purpose(None)
    up = upstream(p, model.RunLimits(requests=2000))

    async def scenario() -> tuple[int, int]:
        client = aioredis.Redis.from_url(redis_url)
        budgets, claims = Budgets(client, up), new_claims()
        total = f"{keys.budget(claims.sub, up.name)}:requests"
        try:
            await budgets.charge(claims, p, time.time())
            held = int(await client.get(total) or 0)
            await budgets.close()
            return held, int(await client.get(total) or 0)
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == (16, 1)
