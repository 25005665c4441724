"""Redis loses its data (FLUSHALL) under traffic: no revoked run or runtime is accepted by the
replicas that lived through it, nor by a replica started after; budgets of runs minted before the
loss fail closed; service resumes without restarts once a broker has restored the revocations."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from contract import generation
from contract.revocations import HASH
from tests.support.gateway_stack import Stack
from tests.support.ha_stack import HAStack, Traffic, call
from tests.support.servers import ThreadedServer
from valetkey.dev.services import RedisServer

OK_DURING_LOSS = {(200, ""), (503, "revocation_state_stale")}


@pytest.fixture
def ha(gateway_stack: Stack) -> Iterator[HAStack]:
    with RedisServer() as server:
        stack = HAStack(gateway_stack, server.url)
        try:
            stack.start_broker()
            stack.start_broker()
            stack.start_gateway()
            stack.start_gateway()
            yield stack
        finally:
            stack.close()


def settled(gateway: ThreadedServer, token: str) -> tuple[int, str]:
    """The answer once the replica has seen the new generation (refusing stale until then)."""
    deadline = time.monotonic() + 5
    answer = call(gateway, token)
    while answer == (503, "revocation_state_stale") and time.monotonic() < deadline:
        time.sleep(0.1)
        answer = call(gateway, token)
    return answer


@pytest.mark.slow
def test_flushall_under_traffic(ha: HAStack) -> None:
    _, live = ha.mint(["read_items", "limited"])
    dead_run, dead = ha.mint(["read_items"], broker=1)
    assert ha.revoke("run", dead_run).status_code == 201
    assert ha.revoke("upstream", "queried", broker=1).status_code == 201
    for gateway in ha.gateways:
        assert call(gateway, dead) == (401, "token_revoked")
        assert call(gateway, live, "/v1/limited") == (200, "")
    client = redis.Redis.from_url(ha.redis_url)
    try:
        with Traffic(ha, {"live": live, "dead": dead}) as traffic:
            time.sleep(0.5)
            flushed = time.monotonic()
            client.flushall()
            resumed = traffic.wait_for("live", 200, flushed + 0.05)
            # a replica started after the loss never accepts the run revoked before it
            late = ha.start_gateway()
            assert call(late, dead) == (401, "token_revoked")
            assert call(late, live) == (200, "")
            time.sleep(0.5)
        refused = [a for a in traffic.of("live", flushed) if a.status != 200]
        assert {(a.status, a.reason) for a in traffic.of("live", flushed)} <= OK_DURING_LOSS
        assert {(a.status, a.reason) for a in traffic.of("dead")} <= {
            (401, "token_revoked"), (503, "revocation_state_stale")}, "a revoked run was accepted"
        assert generation.parse(client.get(generation.KEY)) is not None
        assert client.hexists(HASH, f"run:{dead_run}")
        assert client.hexists(HASH, "upstream:queried")
        # the standing block was restored: no broker mints for the blocked upstream, old or new
        ha.start_broker()
        for index in range(3):
            refusal = ha.post_mint(["read_items"], broker=index, upstream="queried")
            assert (refusal.status_code, refusal.json()["error"]) == (403, "revoked")
        # budgets: the run minted before the loss fails closed; a new run has a budget again
        for gateway in ha.gateways:
            assert call(gateway, live, "/v1/limited") == (503, "budget_state_lost")
        _, fresh = ha.mint(["read_items", "limited"])
        assert call(ha.gateways[0], fresh, "/v1/limited") == (200, "")
        print(f"FLUSHALL: resumed after {resumed - flushed:.2f}s, {len(refused)} requests refused "
              f"(revocation_state_stale) meanwhile")

        # a runtime revocation survives a second loss too, for a replica started after it
        assert ha.revoke("runtime", "tester").status_code == 201
        client.flushall()
        newest = ha.start_gateway()
        assert call(newest, fresh) == (401, "token_revoked")
        assert settled(ha.gateways[0], fresh) == (401, "token_revoked")
        assert ha.lift("runtime", "tester").status_code == 200
        assert ha.lift("upstream", "queried").status_code == 200
    finally:
        client.close()
