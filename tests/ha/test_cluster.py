"""valetkey on a Redis Cluster by URL alone (``redis+cluster://``): two brokers and two gateway
replicas over a real cluster of three masters with a replica each. Everything works (runs,
revocations and their pub/sub, budgets, the audit stream, approvals); then the master serving the
revocation state is killed under traffic and its replica promoted: nothing is allowed on stale
revocation state, service resumes without restarts, revocations and budgets stay consistent, and
every audit line reaches the stream. The Sentinel test's helpers and checks, on a cluster.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from contract import generation, keys, redis_url
from contract.claims import AccessClaims
from contract.errors import Unavailable, ValetkeyError
from contract.redis_url import sync_client
from contract.revocations import RevocationStore, Scope, new_revocation
from gateways.budget import Budgets
from gateways.budget_lease import lease_terms
from gateways.revocation_watcher import RevocationWatcher
from policies import model
from tests.gateways.test_approvals import decide, pending_of, send
from tests.gateways.test_budget_lease import purpose, upstream
from tests.gateways.test_faults import VALETKEY
from tests.support.gateway_stack import Stack
from tests.support.ha_stack import PATH, HAStack, call, fail_over, two_of_each, wait_audit
from tests.support.servers import ThreadedServer
from valetkey.dev.cluster import ClusterNode, ClusterTopology

pytestmark = pytest.mark.slow


@pytest.fixture
def ha(gateway_stack: Stack) -> Iterator[HAStack]:
    with ClusterTopology() as topology, two_of_each(gateway_stack, topology) as stack:
        yield stack


class Calls:
    """``call`` that counts what it sends (each answered request is one audit line)."""

    def __init__(self) -> None:
        self.sent = 0

    def __call__(self, gateway: ThreadedServer, token: str, path: str = PATH) -> tuple[int, str]:
        answer = call(gateway, token, path)
        self.sent += answer[0] != 0
        return answer


def until(check: object, timeout: float = 5.0) -> float:
    """Seconds until ``check()`` holds (AssertionError past ``timeout``)."""
    start = time.monotonic()
    while not (callable(check) and check()):
        assert time.monotonic() - start < timeout, "not within the bound"
        time.sleep(0.01)
    return time.monotonic() - start


def test_whole_stack_works_on_a_cluster(ha: HAStack) -> None:
    topology: ClusterTopology = ha.topology
    client = sync_client(topology.url)
    call = Calls()
    try:
        run, token = ha.mint(["read_items", "limited"], broker=1)
        answers = [call(gateway, token) for gateway in ha.gateways]
        assert answers == [(200, ""), (200, "")]

        # revocation: written by one broker, heard by both replicas over the cluster bus
        doomed_run, doomed = ha.mint(["read_items"])
        assert [call(g, doomed) for g in ha.gateways] == [(200, ""), (200, "")]
        assert ha.revoke("run", doomed_run, broker=1).status_code == 201
        took = until(lambda: all(call(g, doomed) == (401, "token_revoked") for g in ha.gateways))
        # the CLI's break-glass (Redis only) and audit reader take the same URL
        glass_run, glass = ha.mint(["read_items"])
        done = subprocess.run([VALETKEY, "revoke", "--break-glass", "--redis", topology.url, "--run", glass_run,
                               "--reason", "cluster drill"], capture_output=True, text=True, timeout=60,
                              check=False, env={k: v for k, v in os.environ.items() if not k.startswith("VAULT_")})
        assert done.returncode == 0, done.stderr
        until(lambda: all(call(g, glass) == (401, "token_revoked") for g in ha.gateways))
        shown = subprocess.run([VALETKEY, "audit", "query", "--redis", topology.url, "--run", glass_run], capture_output=True,
                               text=True, timeout=60, check=False)
        assert shown.returncode == 0, shown.stderr
        assert "break_glass=True" in shown.stdout
        # budgets: the run's 5 per minute, shared by both replicas
        limited = [call(ha.gateways[i % 2], token, "/v1/limited") for i in range(6)]
        assert [s for s, _ in limited] == [200] * 5 + [429]
        assert limited[-1][1] == "budget_exceeded"

        # a block: minted by neither broker while it stands, lifted by one (tokens
        # issued before it stay refused after the lift)
        assert ha.revoke("runtime", "tester").status_code == 201
        refused = ha.post_mint(["read_items"], broker=1)
        assert (refused.status_code, refused.json()["error"]) == (403, "revoked")
        assert ha.lift("runtime", "tester").status_code == 200
        assert ha.post_mint(["read_items"], broker=1).status_code == 201

        # the state is spread over the masters, each atomic group in its own slot
        revocations = topology.master_of(keys.REVOCATIONS)
        assert revocations is topology.master_of(keys.GENERATION)
        assert client.hexists(keys.REVOCATIONS, f"run:{doomed_run}")
        holding = []
        for master in topology.masters:
            with master.client() as node:
                holding += [master] if node.dbsize() > 0 else []
        assert len(holding) >= 2, "the cluster's keys all landed on one master"

        assert wait_audit(client, call.sent) == call.sent
        print(f"cluster: revocation reached both replicas in {took * 1000:.0f} ms (polled); "
              f"keys on {len(holding)} of {len(topology.masters)} masters; run {run}")
    finally:
        client.close()


def test_approvals_on_a_cluster(ha: HAStack) -> None:
    admin = ha.base.vault.admin_token
    run, token = ha.mint(["publish"])
    denied_run, denied_token = ha.mint(["publish"], broker=1)
    with ThreadPoolExecutor(4) as pool:
        held = send(pool, ha.gateways[0].url, token)
        refused = send(pool, ha.gateways[1].url, denied_token)
        (approval,) = pending_of(ha.brokers[1].url, admin, run)
        (other,) = pending_of(ha.brokers[0].url, admin, denied_run)
        assert decide(ha.brokers[0].url, admin, approval, "approve", digest=approval["digest"]).status_code == 200
        assert decide(ha.brokers[1].url, admin, other, "deny").status_code == 200
        answer, no = held.result(timeout=15), refused.result(timeout=15)
    assert answer.status_code == 200, answer.text
    assert (no.status_code, no.json()["error"]) == (403, "approval_denied")
    again = decide(ha.brokers[1].url, admin, approval, "approve", digest=approval["digest"])
    assert (again.status_code, again.json()["error"]) == (409, "approval_not_pending")


def test_master_killed_under_traffic(ha: HAStack) -> None:
    topology: ClusterTopology = ha.topology
    _, live = ha.mint(["read_items", "limited"])
    dead_run, dead = ha.mint(["read_items"], broker=1)
    assert ha.revoke("run", dead_run).status_code == 201
    call = Calls()
    for gateway in ha.gateways:
        assert call(gateway, live, "/v1/limited") == (200, "")  # 2 of the run's 5 per minute
    client = sync_client(topology.url)
    try:
        for master in topology.masters:  # what was written so far is on the replicas
            with master.client(timeout=3.0) as node:
                node.execute_command("WAIT", 1, 2000)
        failover = fail_over(ha, live, dead, lambda: topology.kill_master_of(keys.REVOCATIONS),
                             lambda old: topology.wait_promoted(keys.REVOCATIONS, old))

        # revocations work on the promoted replica and reach both gateways
        fresh_run, fresh = ha.mint(["read_items"], broker=1)
        assert ha.revoke("run", fresh_run).status_code == 201
        until(lambda: all(call(g, fresh) == (401, "token_revoked") for g in ha.gateways))
        # budgets: two charges before the kill survive; three remain across both replicas
        limited = [call(ha.gateways[i % 2], live, "/v1/limited") for i in range(5)]
        assert [s for s, _ in limited] == [200, 200, 200, 429, 429]

        sent = call.sent + sum(1 for a in failover.traffic.answers if a.status != 0)
        in_stream = wait_audit(client, sent)
        assert in_stream == sent
        print(f"cluster failover: {failover.summary()}; {sent} audit lines sent, {in_stream} in the stream")
    finally:
        client.close()


def subscribed(topology: ClusterTopology) -> list[ClusterNode]:
    """The running nodes holding a subscription to the revocation channel (``PUBSUB NUMSUB`` is
    per node on a cluster)."""
    found = []
    for node in topology.nodes:
        if node.running:
            with node.client() as client:
                if client.execute_command("PUBSUB", "NUMSUB", keys.REVOCATION_CHANNEL)[1]:
                    found.append(node)
    return found


def test_a_watcher_whose_node_dies_resubscribes_elsewhere_and_rereads() -> None:
    """The node a gateway's subscription is on is killed (a replica or a master, whichever it
    was): the watcher reconnects to another node, reloads the hash (a revocation written while it
    was away is there) and hears the next one over the bus."""

    async def scenario(topology: ClusterTopology) -> None:
        client = redis_url.async_client(topology.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        watcher = RevocationWatcher(client, max_stale=1.0, heartbeat=0.2, require_generation=True)
        store = RevocationStore(client)
        try:
            await generation.establish(client)
            await watcher.start()
            (node,) = subscribed(topology)
            node.kill()
            killed = time.monotonic()
            away = new_revocation(Scope.RUN, "run_while_away", "test", "written while the node was dead")
            while True:  # the node may have been the revocations' master: retry until promoted
                try:
                    await store.put(away)
                    break
                except Unavailable:
                    assert time.monotonic() - killed < 30, "no master for the revocations"
                    await asyncio.sleep(0.1)
            while not (watcher.fresh and away.key in {r.key for r in watcher.state.records()}):
                assert time.monotonic() - killed < 15, "the watcher did not reconnect and reload"
                await asyncio.sleep(0.05)
            back = time.monotonic() - killed
            (elsewhere,) = subscribed(topology)
            assert elsewhere is not node
            after = new_revocation(Scope.RUN, "run_after", "test", "published after the reconnect")
            sent = time.monotonic()
            await store.put(after)
            while after.key not in {r.key for r in watcher.state.records()}:
                assert time.monotonic() - sent < 1.0, "not heard over the bus within 1 s"
                await asyncio.sleep(0.01)
            print(f"cluster watcher: subscription node :{node.port} killed, fresh again on :{elsewhere.port} "
                  f"{back:.2f}s later with the record written meanwhile")
        finally:
            await watcher.stop()
            await client.aclose()

    with ClusterTopology() as topology:
        asyncio.run(scenario(topology))


def test_concurrent_budget_charges_are_exact_on_a_cluster(gateway_stack: Stack) -> None:
    """redis-py pipelines no script call on a cluster, so the charges of one event-loop turn go
    one by one (a bounded number at once): 40 runs of 8 charges at once (past the batch size and
    the bound), each run's slot on whichever master, give exactly 5 of 8 per run (5 per minute)."""
    upstream = gateway_stack.policies.upstreams["echo"]
    purpose = upstream.purposes["limited"]
    now = time.time()
    runs = [AccessClaims.new(issuer="i", run_id=f"run_{i}_{time.time_ns()}", audience="echo", runtime="tester",
                             grants=[], now=int(now), ttl=600) for i in range(40)]

    async def scenario(url: str) -> list[list[str]]:
        client = redis_url.async_client(url)
        budgets = Budgets(client, upstream)
        try:
            answers = await asyncio.gather(*(budgets.charge(claims, purpose, now) for claims in runs
                                             for _ in range(8)), return_exceptions=True)
        finally:
            await client.aclose()
        codes = [getattr(a, "code", "ok") if a is not None else "ok" for a in answers]
        return [codes[i * 8:(i + 1) * 8] for i in range(len(runs))]

    async def beyond_the_pool(url: str) -> list[Any]:
        # a small pool: calls wait for a free connection (as on one server), none is refused
        client = redis_url.async_client(url, max_connections=4, pool_timeout=10.0)
        try:
            await asyncio.gather(*(client.incr(f"{{pool}}:{i % 3}") for i in range(300)))
            return list(await asyncio.gather(*(client.get(f"{{pool}}:{i}") for i in range(3))))
        finally:
            await client.aclose()

    with ClusterTopology(replicas=False) as topology:
        per_run = asyncio.run(scenario(topology.url))
        spread = {topology.master_of(keys.budget(c.sub, "echo")).port for c in runs}
        assert asyncio.run(beyond_the_pool(topology.url)) == [b"100"] * 3
        given, given_again, at_once, in_all = asyncio.run(leased(topology.url))
    assert (given, given_again) == (3, 0)
    assert 319 - 2 * lease_terms(LEASED, LEASED_UPSTREAM)[0] <= at_once <= 319
    assert in_all == 319
    counts = sorted({(c.count("ok"), c.count("budget_exceeded")) for c in per_run})
    assert counts == [(5, 3)], [sorted(set(c)) for c in per_run if c.count("ok") != 5][:3]
    assert len(spread) == 3


LEASED = purpose(model.Rate(320, 60))
LEASED_UPSTREAM = upstream(LEASED, model.RunLimits(requests=1000))


async def leased(url: str) -> tuple[int, int, int, int]:
    """A generous limit on a cluster (script and give-back routed by the run's hash tag): a
    give-back sent twice gives back once; then two replicas' leases admit at most the rest of the
    limit at once, and exactly the rest once every lease is given back."""
    clients = [redis_url.async_client(url) for _ in range(2)]
    claims = AccessClaims.new(issuer="i", run_id=f"run_leased_{time.time_ns()}", audience="echo",
                              runtime="tester", grants=[], now=int(time.time()), ttl=600)

    async def outcome(budgets: Budgets) -> str:
        try:
            await budgets.charge(claims, LEASED, time.time())
        except ValetkeyError as exc:
            return exc.code
        return "ok"

    replicas = [Budgets(c, LEASED_UPSTREAM) for c in clients]
    try:
        grant = await replicas[0]._ask(claims, LEASED, 4, 1.0)  # one spent, three given back
        given = [int(str(await grant.give_back(3))) for _ in range(2)]
        first = await asyncio.gather(*(outcome(replicas[i % 2]) for i in range(400)))
        await asyncio.sleep(lease_terms(LEASED, LEASED_UPSTREAM)[1] + 0.3)
        later = [await outcome(replicas[i % 2]) for i in range(400)]
        return given[0], given[1], first.count("ok"), first.count("ok") + later.count("ok")
    finally:
        for r in replicas:
            await r.close()
        for c in clients:
            await c.aclose()
