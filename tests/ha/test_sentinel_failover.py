"""The Redis primary is killed under traffic through two brokers and two gateway replicas, and
Sentinel promotes the replica: nothing is allowed on stale revocation state, service resumes
without restarts, revocations and budgets stay consistent, and every audit line reaches the stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from contract.redis_url import sync_client
from tests.support.gateway_stack import Stack
from tests.support.ha_stack import HAStack, Traffic, call
from valetkey.dev.sentinel import SentinelTopology

# while the primary is gone: served from memory for at most VALETKEY_REVOCATION_MAX_STALE, then
# refused; budgeted and Redis-bound work refused at once
MAX_STALE = "1s"
DURING_FAILOVER = {(200, ""), (503, "revocation_state_stale"), (503, "redis_unavailable")}


@pytest.fixture
def ha(gateway_stack: Stack) -> Iterator[HAStack]:
    with SentinelTopology() as topology:
        stack = HAStack(gateway_stack, topology.url)
        stack.topology = topology  # type: ignore[attr-defined]
        try:
            stack.start_broker()
            stack.start_broker()
            # 1 s (default 3 s): a failover of ~2.5 s then shows the refusals, not only memory
            stack.start_gateway(VALETKEY_REVOCATION_MAX_STALE=MAX_STALE)
            stack.start_gateway(VALETKEY_REVOCATION_MAX_STALE=MAX_STALE)
            yield stack
        finally:
            stack.close()


@pytest.mark.slow
def test_primary_killed_under_traffic(ha: HAStack) -> None:
    topology: SentinelTopology = ha.topology  # type: ignore[attr-defined]
    _, live = ha.mint(["read_items", "limited"])
    dead_run, dead = ha.mint(["read_items"], broker=1)
    assert ha.revoke("run", dead_run).status_code == 201
    explicit = 0
    for gateway in ha.gateways:
        assert call(gateway, live, "/v1/limited") == (200, "")  # 2 of the run's 5 per minute
        explicit += 1
    client = sync_client(topology.url)
    try:
        client.execute_command("WAIT", 1, 2000)  # what was written so far is on the replica
        with Traffic(ha, {"live": live, "dead": dead}) as traffic:
            time.sleep(0.5)
            killed_at = time.monotonic()
            old = topology.kill_primary()
            new = topology.wait_promoted(old)
            promoted_at = time.monotonic()
            resumed_at = traffic.wait_for("live", 200, promoted_at)
            time.sleep(0.5)
        during = [a for a in traffic.of("live", killed_at) if a.at <= resumed_at]
        assert {(a.status, a.reason) for a in traffic.of("live", killed_at)} <= DURING_FAILOVER
        assert {(a.status, a.reason) for a in traffic.of("dead")} <= {
            (401, "token_revoked"), (503, "revocation_state_stale")}
        refused = [a for a in during if a.status != 200]
        assert refused, "no request was refused while no primary answered for longer than max_stale"
        # nothing allowed once the state went stale, until Redis answered again: after the first
        # refusal of a replica, its next 200 comes only after the promotion
        for index in range(2):
            mine = [a for a in during if a.gateway == index]
            first = next((a.at for a in mine if a.status == 503), None)
            assert first is None or all(a.at >= promoted_at - 1.0 for a in mine
                                        if a.status == 200 and a.at > first)

        # revocations work on the new primary and reach both replicas
        fresh_run, fresh = ha.mint(["read_items"], broker=1)
        assert ha.revoke("run", fresh_run).status_code == 201
        time.sleep(0.3)
        for gateway in ha.gateways:
            assert call(gateway, fresh) == (401, "token_revoked")
            explicit += 1
        # budgets: the promoted replica has the two charges; three remain across both replicas
        limited = [call(ha.gateways[i % 2], live, "/v1/limited") for i in range(5)]
        explicit += 5
        assert [s for s, _ in limited] == [200, 200, 200, 429, 429]

        # audit: every line the gateways answered reaches the stream of the new primary
        sent = explicit + sum(1 for a in traffic.answers if a.status != 0)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            in_stream = sum(1 for _, f in client.xrange("valetkey:audit")
                            if f.get(b"kind") == b"request" and "decision" in json.loads(f[b"line"]))
            if in_stream >= sent:
                break
            time.sleep(0.2)
        assert in_stream == sent
        print(f"sentinel failover: primary {old} -> {new}; promoted {promoted_at - killed_at:.1f}s after "
              f"the kill, traffic resumed {resumed_at - killed_at:.1f}s after; {len(refused)} of "
              f"{len(during)} requests refused meanwhile ({sorted({a.reason for a in refused})}); "
              f"{sent} audit lines sent, {in_stream} in the stream")
    finally:
        client.close()
