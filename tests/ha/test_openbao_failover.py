"""The OpenBao leader of a three-node Raft cluster is killed under traffic: mints pause
(``vault_unavailable``) and resume with the new leader without restarts; gateways keep serving
with their cached secret; the signing key and the JWKS are unchanged."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.gateway_stack import Stack
from tests.support.ha_stack import HAStack, Traffic, call
from valetkey.dev.raft import RaftCluster
from valetkey.dev.services import RedisServer
from valetkey.dev.vault_seed import DevVault


@pytest.fixture
def ha(gateway_stack: Stack) -> Iterator[HAStack]:
    with RaftCluster() as cluster, RedisServer() as redis:
        leader = cluster.nodes[cluster.wait_leader()].addr
        vault = DevVault.create(leader, cluster.root_token, gateway_stack.policies)
        # the echo upstream accepts the session stack's secret: put that one in this Vault too
        httpx.post(f"{leader}/v1/secret/data/valetkey/tests/echo", timeout=10,
                   headers={"X-Vault-Token": cluster.root_token},
                   json={"data": {"value": gateway_stack.vault.secrets["echo"]}}).raise_for_status()
        stack = HAStack(dataclasses.replace(gateway_stack, vault=vault), redis.url, vault_addr=cluster.addr)
        stack.cluster = cluster  # type: ignore[attr-defined]
        try:
            stack.start_broker()
            stack.start_broker()
            stack.start_gateway()
            stack.start_gateway()
            yield stack
        finally:
            stack.close()


def jwks(ha: HAStack) -> list[object]:
    return [httpx.get(f"{b.url}/.well-known/jwks.json", timeout=5).json() for b in ha.brokers]


@pytest.mark.slow
def test_leader_killed_under_traffic(ha: HAStack) -> None:
    cluster: RaftCluster = ha.cluster  # type: ignore[attr-defined]
    keys_before = jwks(ha)
    _, live = ha.mint(["read_items"])
    with Traffic(ha, {"live": live}) as traffic:
        time.sleep(0.3)
        old = cluster.wait_leader()
        killed_at = time.monotonic()
        cluster.kill(old)
        refused: list[tuple[int, str]] = []
        resumed_at = 0.0
        while time.monotonic() - killed_at < 60:
            for index in range(2):
                response = ha.post_mint(["read_items"], broker=index)
                if response.status_code == 201:
                    resumed_at = resumed_at or time.monotonic()
                else:
                    refused.append((response.status_code, response.json()["error"]))
            if resumed_at:
                break
            time.sleep(0.1)
        assert resumed_at, "mints did not resume within 60 s"
        new = cluster.wait_leader()
        time.sleep(0.3)
    assert new != old
    assert set(refused) <= {(503, "vault_unavailable")}
    # the gateways never needed Vault on the request path: every request was served
    assert {(a.status, a.reason) for a in traffic.of("live")} == {(200, "")}
    assert jwks(ha) == keys_before
    _, fresh = ha.mint(["read_items"], broker=1)
    for gateway in ha.gateways:
        assert call(gateway, fresh) == (200, "")
    print(f"OpenBao leader killed: mints resumed after {resumed_at - killed_at:.1f}s, {len(refused)} "
          f"mints refused (vault_unavailable) meanwhile; {len(traffic.of('live'))} gateway requests, "
          "all served")

    # quorum lost (one node of three left): what a standby can serve alone (token lookups, transit
    # signing: reads) goes on; then no node at all: mints pause (vault_unavailable), gateways serve;
    # two nodes back: mints resume. Never another error, never a different signing key.
    with Traffic(ha, {"live": live}) as traffic:
        cluster.kill(new)
        alone = [ha.post_mint(["read_items"]) for _ in range(5)]
        last = next(i for i in range(3) if i not in (old, new))
        cluster.kill(last)
        down_at = time.monotonic()
        paused = [ha.post_mint(["read_items"]) for _ in range(5)]
        cluster.restart(old)
        cluster.restart(new)
        back_at = time.monotonic()
        while ha.post_mint(["read_items"]).status_code != 201:
            assert time.monotonic() - back_at < 60, "mints did not resume once two nodes were back"
            time.sleep(0.2)
        resumed = time.monotonic() - back_at
    outcomes = {(r.status_code, r.json().get("error", "")) for r in alone}
    assert outcomes <= {(201, ""), (503, "vault_unavailable")}
    assert {(r.status_code, r.json()["error"]) for r in paused} == {(503, "vault_unavailable")}
    assert {(a.status, a.reason) for a in traffic.of("live")} == {(200, "")}
    assert jwks(ha) == keys_before
    print(f"OpenBao without quorum: {sum(r.status_code == 201 for r in alone)} of 5 mints served by the "
          f"last standby; every node down for {back_at - down_at:.1f}s: 5 of 5 mints refused "
          f"(vault_unavailable); mints resumed {resumed:.1f}s after two nodes were back (unsealed); "
          f"{len(traffic.of('live'))} gateway requests, all served")
