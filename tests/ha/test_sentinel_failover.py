"""The Redis primary is killed under traffic through two brokers and two gateway replicas, and
Sentinel promotes the replica: nothing is allowed on stale revocation state, service resumes
without restarts, revocations and budgets stay consistent, and every audit line reaches the stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from contract.redis_url import sync_client
from tests.support.gateway_stack import Stack
from tests.support.ha_stack import HAStack, call, fail_over, two_of_each, wait_audit
from valetkey.dev.sentinel import SentinelTopology


@pytest.fixture
def ha(gateway_stack: Stack) -> Iterator[HAStack]:
    with SentinelTopology() as topology, two_of_each(gateway_stack, topology) as stack:
        yield stack


@pytest.mark.slow
def test_primary_killed_under_traffic(ha: HAStack) -> None:
    topology: SentinelTopology = ha.topology
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
        failover = fail_over(ha, live, dead, topology.kill_primary, topology.wait_promoted)

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
        sent = explicit + sum(1 for a in failover.traffic.answers if a.status != 0)
        in_stream = wait_audit(client, sent)
        assert in_stream == sent
        print(f"sentinel failover: {failover.summary()}; {sent} audit lines sent, {in_stream} in the stream")
    finally:
        client.close()
