"""Revocation, budgets and alerts across two real gateway processes, one broker, a Redis of their
own (stopped and restarted here), real OpenBao, and a real webhook receiver."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from broker.app import create_app
from broker.settings import BrokerSettings
from contract.revocations import CHANNEL, HASH, Revocation, Scope, new_revocation
from contract.secret import Secret
from gateways.detectors import verify_signature
from tests.support.asgi import read_body
from tests.support.gateway_stack import ISSUER, Stack
from tests.support.servers import ThreadedServer
from valetkey.dev.services import RedisServer, free_port

VALETKEY = str(Path(sys.executable).parent / "valetkey")
WEBHOOK_SECRET = "whsec-test-0123456789abcdef"
ITEM = {"upstream": "echo", "purpose": "read_items"}


@dataclass
class Receiver:
    """A real HTTP receiver for alert webhooks (the person on call)."""

    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.posts.append((headers, body))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def alerts(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for headers, body in list(self.posts):
            assert verify_signature(Secret(WEBHOOK_SECRET), body, headers["x-valetkey-signature"])
            out.append(json.loads(body))
        return out


@dataclass
class Fleet:
    stack: Stack
    redis: RedisServer
    broker_url: str
    replicas: list[str]
    receiver: Receiver

    def mint(self, grants: list[dict[str, Any]] | None = None) -> httpx.Response:
        return httpx.post(f"{self.broker_url}/v1/runs", json={"grants": grants or [ITEM]},
                          headers={"X-Vault-Token": self.stack.vault.runtime_token("tester")})

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.broker_url}{path}",
                             headers={"X-Vault-Token": self.stack.vault.admin_token}, **kwargs)

    def get(self, replica: str, token: str, path: str = "/v1/items") -> httpx.Response:
        return httpx.get(f"{replica}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10)


def eventually(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


def _spawn(fleet_env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **fleet_env, "VALETKEY_LISTEN": f"127.0.0.1:{port}"}
    with log.open("w") as out:
        return subprocess.Popen([VALETKEY, "gateway", "serve", "--upstream", "echo"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def _broker_settings(stack: Stack, redis_url: str) -> BrokerSettings:
    return BrokerSettings.from_env({
        "VAULT_ADDR": stack.vault.addr, "VAULT_TOKEN": stack.vault.broker_token, "VALETKEY_REDIS_URL": redis_url,
        "VALETKEY_POLICY_DIR": str(Path(stack.policies.upstreams["echo"].source).parent),
        "VALETKEY_ISSUER": ISSUER,
    })


@pytest.fixture(scope="module")
def fleet(gateway_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("fleet")
    own_redis = RedisServer()
    own_redis.start()
    receiver = Receiver()
    hook = ThreadedServer(receiver).start()
    policy_dir = Path(gateway_stack.policies.upstreams["echo"].source).parent
    broker = ThreadedServer(create_app(_broker_settings(gateway_stack, own_redis.url),
                                       gateway_stack.policies)).start()
    env = {"VAULT_ADDR": gateway_stack.vault.addr, "VAULT_TOKEN": gateway_stack.vault.gateway_token("echo"),
           "VALETKEY_REDIS_URL": own_redis.url, "VALETKEY_BROKER_URL": broker.url, "VALETKEY_ISSUER": ISSUER,
           "VALETKEY_POLICY_DIR": str(policy_dir), "VALETKEY_REVOCATION_MAX_STALE": "1s",
           "VALETKEY_ALERT_WEBHOOK_URL": f"{hook.url}/alerts", "VALETKEY_ALERT_WEBHOOK_SECRET": WEBHOOK_SECRET}
    ports = [free_port(), free_port()]
    procs = [_spawn(env, port, logs / f"gateway-{i}.log") for i, port in enumerate(ports)]
    replicas = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for replica, proc, i in zip(replicas, procs, range(2), strict=True):
            def ready(url: str = replica) -> bool:
                try:
                    return httpx.get(f"{url}/.valetkey/readyz", timeout=1).status_code == 200
                except httpx.TransportError:
                    return False
            try:
                eventually(ready, 20)
            except AssertionError:
                raise AssertionError((logs / f"gateway-{i}.log").read_text()) from None
            assert proc.poll() is None
        yield Fleet(gateway_stack, own_redis, broker.url, replicas, receiver)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        broker.stop()
        hook.stop()
        own_redis.close()
    for i in range(2):
        text = (logs / f"gateway-{i}.log").read_text()
        for secret in gateway_stack.vault.secrets.values():
            assert secret not in text


def _refused_everywhere(fleet: Fleet, token: str, code: str = "token_revoked") -> None:
    for replica in fleet.replicas:
        eventually(lambda r=replica: fleet.get(r, token).json().get("error") == code)


@pytest.mark.parametrize(("scope", "name"), [
    pytest.param("run", None, id="run"),
    pytest.param("runtime", "tester", id="runtime"),
    pytest.param("upstream", "echo", id="upstream"),
    pytest.param("all", "", id="all"),
])
def test_each_revocation_kind_stops_every_replica(fleet: Fleet, scope: str, name: str | None) -> None:
    bundle = fleet.mint().json()
    token = bundle["env"]["ECHO_TOKEN"]
    for replica in fleet.replicas:
        assert fleet.get(replica, token).status_code == 200
    target = bundle["run_id"] if name is None else name
    revoked = fleet.admin("POST", "/v1/revocations", json={"scope": scope, "name": target, "reason": "test"})
    assert revoked.status_code == 201, revoked.text
    assert revoked.json()["who"].startswith("admin:")
    _refused_everywhere(fleet, token)
    if scope == "run":
        return
    refused = fleet.mint()
    assert (refused.status_code, refused.json()["error"]) == (403, "revoked")
    path = "/v1/revocations/all" if scope == "all" else f"/v1/revocations/{scope}/{name}"
    lifted = fleet.admin("DELETE", path)
    assert lifted.status_code == 200, lifted.text
    assert lifted.json()["blocked"] is False
    time.sleep(1.1)  # tokens issued in the revocation's second stay revoked (iat <= not_before)
    fresh = fleet.mint()
    assert fresh.status_code == 201
    for replica in fleet.replicas:
        eventually(lambda r=replica: fleet.get(r, fresh.json()["env"]["ECHO_TOKEN"]).status_code == 200)
        assert fleet.get(replica, token).json()["error"] == "token_revoked"  # the old one stays dead


def test_revocations_are_recorded_and_audited(fleet: Fleet) -> None:
    listed = fleet.admin("GET", "/v1/revocations").json()["revocations"]
    assert any(r["scope"] == "runtime" and r["name"] == "tester" and not r["blocked"] for r in listed)
    runtime_token = fleet.stack.vault.runtime_token("tester")
    refused = httpx.get(f"{fleet.broker_url}/v1/revocations", headers={"X-Vault-Token": runtime_token})
    assert (refused.status_code, refused.json()["error"]) == (403, "not_admin")


def test_sse_stream_of_revoked_run_is_cut(fleet: Fleet) -> None:
    bundle = fleet.mint().json()
    token = bundle["env"]["ECHO_TOKEN"]
    received: list[str] = []
    outcome: dict[str, Any] = {}
    while fleet.stack.upstreams["echo"].sse_gate.acquire(blocking=False):
        pass  # the upstream must wait for us after its first event

    def consume() -> None:
        try:
            with httpx.stream("GET", f"{fleet.replicas[0]}/v1/sse", timeout=20,
                              headers={"Authorization": f"Bearer {token}"}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        received.append(line[6:])
            outcome["ended"] = "closed"
        except httpx.HTTPError as exc:
            outcome["ended"] = type(exc).__name__

    reader = threading.Thread(target=consume)
    reader.start()
    eventually(lambda: received == ["event 0."])
    started = time.monotonic()
    fleet.admin("POST", "/v1/revocations", json={"scope": "run", "name": bundle["run_id"], "reason": "cut"})
    reader.join(timeout=10)
    assert not reader.is_alive(), "stream was not cut"
    assert time.monotonic() - started < 5
    assert "[DONE]" not in received
    assert outcome["ended"]
    fleet.stack.upstreams["echo"].sse_gate.release(3)  # let the upstream handler finish


def test_budget_holds_exactly_across_replicas(fleet: Fleet) -> None:
    token = fleet.mint([{"upstream": "echo", "purpose": "limited"}]).json()["env"]["ECHO_TOKEN"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        responses = list(pool.map(lambda i: fleet.get(fleet.replicas[i % 2], token, "/v1/limited"), range(24)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) == 5  # "5 per 1m", exactly, whichever replica served them
    assert statuses.count(429) == 19
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.json()["error"] == "budget_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 60


def test_run_request_total(gateway_stack: Stack) -> None:
    bundle = gateway_stack.mint([{"upstream": "queried", "purpose": "read_items"}])
    token = bundle["env"]["QUERIED_TOKEN"]
    codes = [httpx.get(f"{gateway_stack.url('queried')}/v1/items", params={"key": token}).status_code
             for _ in range(6)]
    assert codes == [200, 200, 200, 200, 429, 429]  # run_limits: {requests: 4}


def test_denial_burst_alerts_on_call_and_revokes_the_run(fleet: Fleet) -> None:
    bundle = fleet.mint().json()
    token, run_id = bundle["env"]["ECHO_TOKEN"], bundle["run_id"]
    for i in range(10):
        fleet.get(fleet.replicas[i % 2], token, f"/v1/probe/{i}")
    eventually(lambda: any(a["run"] == run_id and a["alert"] == "denial_burst" for a in fleet.receiver.alerts()))
    alert = next(a for a in fleet.receiver.alerts() if a["run"] == run_id and a["alert"] == "denial_burst")
    assert alert["auto_revoke"] is True
    assert alert["count"] >= 10
    assert any(a["run"] == run_id and a["alert"] == "probing" for a in fleet.receiver.alerts())
    _refused_everywhere(fleet, token)


def test_passthrough_attempt_alerts_and_revokes(fleet: Fleet) -> None:
    bundle = fleet.mint().json()
    token, run_id = bundle["env"]["ECHO_TOKEN"], bundle["run_id"]
    attempt = httpx.get(f"{fleet.replicas[1]}/v1/items", headers={
        "Authorization": f"Bearer {token}", "X-Backup": "ghp_" + "Q" * 36})
    assert attempt.json()["error"] == "credential_passthrough"
    eventually(lambda: any(a["run"] == run_id and a["alert"] == "credential_passthrough"
                           for a in fleet.receiver.alerts()))
    _refused_everywhere(fleet, token)


def test_vault_token_created_for_a_run_is_revoked_with_it(fleet: Fleet) -> None:
    import asyncio

    import redis.asyncio as aioredis

    from broker.runs import RunRegistry
    from contract.vault import VaultClient

    bundle = fleet.mint().json()

    async def attach() -> str:
        vault = VaultClient(fleet.stack.vault.addr, Secret(fleet.stack.vault.broker_token))
        client = aioredis.Redis.from_url(fleet.redis.url)
        try:
            token, accessor = await vault.create_run_token("valetkey-run", 600, {"run": bundle["run_id"]})
            await RunRegistry(client).attach_vault_accessor(bundle["run_id"], accessor)
            return token.reveal()
        finally:
            await vault.aclose()
            await client.aclose()

    run_token = asyncio.run(attach())
    lookup = httpx.get(f"{fleet.stack.vault.addr}/v1/auth/token/lookup-self", headers={"X-Vault-Token": run_token})
    assert lookup.status_code == 200
    ended = httpx.delete(f"{fleet.broker_url}/v1/runs/{bundle['run_id']}",
                         headers={"X-Vault-Token": fleet.stack.vault.runtime_token("tester")})
    assert ended.status_code == 200
    lookup = httpx.get(f"{fleet.stack.vault.addr}/v1/auth/token/lookup-self", headers={"X-Vault-Token": run_token})
    assert lookup.status_code == 403
    _refused_everywhere(fleet, bundle["env"]["ECHO_TOKEN"])


def test_audit_api_and_cli(fleet: Fleet) -> None:
    bundle = fleet.mint().json()
    token, run_id = bundle["env"]["ECHO_TOKEN"], bundle["run_id"]
    fleet.get(fleet.replicas[0], token)
    fleet.get(fleet.replicas[1], token, "/v1/nope")
    fleet.admin("POST", "/v1/revocations", json={"scope": "run", "name": run_id, "reason": "audit test"})

    def trail() -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = fleet.admin("GET", f"/v1/runs/{run_id}/audit").json()["entries"]
        return entries
    eventually(lambda: {e["kind"] for e in trail()} >= {"request", "revocation"})
    kinds = [(e["kind"], e["line"].get("reason", e["line"].get("event"))) for e in trail()]
    assert ("request", "ok") in kinds
    assert ("request", "purpose_not_granted") in kinds
    assert ("revocation", "revoke") in kinds
    runtime = httpx.get(f"{fleet.broker_url}/v1/runs/{run_id}/audit",
                        headers={"X-Vault-Token": fleet.stack.vault.runtime_token("tester")})
    assert runtime.status_code == 403
    env = {**os.environ, "VALETKEY_REDIS_URL": fleet.redis.url}
    query = subprocess.run([VALETKEY, "audit", "query", "--run", run_id, "--json"], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert query.returncode == 0, query.stderr
    lines = [json.loads(line) for line in query.stdout.splitlines()]
    assert {line["kind"] for line in lines} >= {"request", "revocation"}
    tail = subprocess.run([VALETKEY, "audit", "tail", "--run", run_id, "--decision", "deny"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert "purpose_not_granted" in tail.stdout
    assert token not in query.stdout + tail.stdout


def test_revoke_cli(fleet: Fleet) -> None:
    env = {**os.environ, "VAULT_TOKEN": fleet.stack.vault.admin_token, "VALETKEY_BROKER_URL": fleet.broker_url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([VALETKEY, *args], env=env, capture_output=True, text=True, timeout=60, check=False)

    revoked = cli("revoke", "--upstream", "echo", "--reason", "incident 42")
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked upstream echo" in revoked.stdout
    assert "incident 42" in cli("revocations").stdout
    assert fleet.mint().json()["error"] == "revoked"
    lifted = cli("revoke", "--upstream", "echo", "--lift")
    assert lifted.returncode == 0, lifted.stderr
    again = cli("revoke", "--upstream", "echo", "--lift")  # nothing standing
    assert (again.returncode, "revocation_not_found" in again.stderr) == (1, True), again.stderr
    token = fleet.mint().json()["env"]["ECHO_TOKEN"]
    everything = cli("revoke", "--all", "--lift")  # on a healthy system: refused, nobody cut off
    assert (everything.returncode, "revocation_not_found" in everything.stderr) == (1, True)
    assert fleet.get(fleet.replicas[0], token).status_code == 200
    assert cli("revoke", "--run", "x", "--all").returncode == 1  # exactly one scope


def test_alert_revocation_also_ends_the_run_in_the_registry(fleet: Fleet) -> None:
    """Whoever writes a run revocation (here: a gateway's auto-revoke), the broker finishes it."""
    bundle = fleet.mint().json()
    attempt = httpx.get(f"{fleet.replicas[0]}/v1/items", headers={
        "Authorization": f"Bearer {bundle['env']['ECHO_TOKEN']}", "Cookie": "k=ghp_" + "Z" * 36})
    assert attempt.json()["error"] == "credential_passthrough"

    def ended() -> bool:  # ended in the registry; shown as revoked, by the gateway's alert
        run = fleet.admin("GET", f"/v1/runs/{bundle['run_id']}").json()
        return bool(run.get("ended_at") and run.get("state") == "revoked"
                    and run.get("revoked_by") == "valetkey-gateway:echo")
    eventually(ended)


def test_end_run_from_inside(fleet: Fleet) -> None:
    bundle = fleet.mint().json()
    headers = {"Authorization": f"Bearer {bundle['env']['ECHO_TOKEN']}"}
    assert httpx.get(f"{fleet.replicas[0]}/.valetkey/end-run", headers=headers).status_code == 405
    assert httpx.post(f"{fleet.replicas[0]}/.valetkey/end-run").json()["error"] == "missing_token"
    ended = httpx.post(f"{fleet.replicas[0]}/.valetkey/end-run", headers=headers)
    assert ended.status_code == 200, ended.text
    _refused_everywhere(fleet, bundle["env"]["ECHO_TOKEN"])
    eventually(lambda: fleet.admin("GET", f"/v1/runs/{bundle['run_id']}").json().get("state") == "ended")


def test_refusals_of_signed_tokens_are_attributed_to_their_run(fleet: Fleet) -> None:
    bundle = fleet.mint([ITEM, {"upstream": "keyed", "purpose": "read_items"}]).json()
    wrong = fleet.get(fleet.replicas[0], bundle["env"]["KEYED_TOKEN"])
    assert wrong.json()["error"] == "audience_mismatch"

    def attributed() -> bool:
        entries = fleet.admin("GET", f"/v1/runs/{bundle['run_id']}/audit").json()["entries"]
        return any(e["line"].get("reason") == "audience_mismatch" for e in entries)
    eventually(attributed)


def test_credential_in_the_path_is_refused_and_withheld(fleet: Fleet) -> None:
    bundle = fleet.mint().json()
    secretish = "ghp_" + "P" * 36
    response = fleet.get(fleet.replicas[0], bundle["env"]["ECHO_TOKEN"], f"/v1/items/{secretish}")
    assert (response.status_code, response.json()["error"]) == (403, "credential_passthrough")

    def withheld() -> bool:
        entries = fleet.admin("GET", f"/v1/runs/{bundle['run_id']}/audit").json()["entries"]
        lines = [e["line"] for e in entries if e["kind"] == "request"]
        return any(line.get("path", "").startswith("[path withheld") for line in lines)
    eventually(withheld)
    raw = json.dumps(fleet.admin("GET", f"/v1/runs/{bundle['run_id']}/audit").json())
    assert secretish not in raw


def test_revoke_unknown_run(fleet: Fleet) -> None:
    revoked = fleet.admin("POST", "/v1/revocations", json={"scope": "run", "name": "run_lost", "reason": "x"})
    assert revoked.status_code == 201


LIFT_REFUSALS = [
    pytest.param("/v1/revocations/all", 404, "revocation_not_found", id="all-when-nothing-stands"),
    pytest.param("/v1/revocations/upstream/echo", 404, "revocation_not_found", id="upstream-never-revoked"),
    pytest.param("/v1/revocations/runtime/tester-never-in-policy", 404, "unknown_revocation_target",
                 id="runtime-not-in-policy"),
    pytest.param("/v1/revocations/upstream/nosuch", 404, "unknown_revocation_target", id="upstream-not-in-policy"),
    pytest.param("/v1/revocations/all/x", 400, "invalid_request", id="all-with-a-name"),
    pytest.param("/v1/revocations/run/run_lost", 400, "invalid_request", id="run"),
]


@pytest.mark.parametrize(("path", "status", "code"), LIFT_REFUSALS)
def test_lifting_what_does_not_stand_changes_nothing(fleet: Fleet, path: str, status: int, code: str) -> None:
    """Lifting a revocation that does not exist used to write one (lifted, but covering every token
    issued up to then): ``revoke --all --lift`` on a healthy system cut off every run."""
    token = fleet.mint().json()["env"]["ECHO_TOKEN"]
    before = fleet.admin("GET", "/v1/revocations").json()
    lifted = fleet.admin("DELETE", path)
    assert (lifted.status_code, lifted.json()["error"]) == (status, code), lifted.text
    assert fleet.admin("GET", "/v1/revocations").json() == before
    time.sleep(0.2)  # anything published would have reached the replicas by now
    for replica in fleet.replicas:
        assert fleet.get(replica, token).status_code == 200


def test_revoking_a_target_not_in_policy_is_refused(fleet: Fleet) -> None:
    refused = fleet.admin("POST", "/v1/revocations", json={"scope": "upstream", "name": "nosuch"})
    assert (refused.status_code, refused.json()["error"]) == (404, "unknown_revocation_target")


def test_junk_revocation_records(fleet: Fleet) -> None:
    """A garbled record of a real scope blocks that scope at the gateways and the broker (fail
    closed); a field that names no scope revokes nothing. A starting broker's reaper deletes the
    junk and rewrites the garbled record as a proper block, which an admin then lifts."""
    client = redis.Redis.from_url(fleet.redis.url)
    victim, bystander = fleet.mint().json(), fleet.mint().json()
    try:
        client.hset(HASH, mapping={
            "bogus-field": new_revocation(Scope.ALL, "", "someone", "not a field valetkey writes").to_json(),
            f"run:{victim['run_id']}": "{garbled",
        })
        client.publish(CHANNEL, "{garbled")  # a malformed message: each replica reloads the hash
        _refused_everywhere(fleet, victim["env"]["ECHO_TOKEN"])
        for replica in fleet.replicas:
            assert fleet.get(replica, bystander["env"]["ECHO_TOKEN"]).status_code == 200

        client.hset(HASH, "runtime:tester", "not json")
        assert (fleet.mint().status_code, fleet.mint().json()["error"]) == (403, "revoked")
        with ThreadedServer(create_app(_broker_settings(fleet.stack, fleet.redis.url),
                                       fleet.stack.policies)):
            eventually(lambda: not client.hexists(HASH, "bogus-field"))
        for field in (f"run:{victim['run_id']}", "runtime:tester"):
            repaired = Revocation.from_json(client.hget(HASH, field))
            assert (repaired.key, repaired.blocked, repaired.who) == (field, True, "valetkey")
        _refused_everywhere(fleet, victim["env"]["ECHO_TOKEN"])
    finally:
        lifted = fleet.admin("DELETE", "/v1/revocations/runtime/tester")
        client.close()
    assert lifted.status_code == 200, lifted.text
    time.sleep(1.1)  # tokens issued in the lift's second stay revoked (iat <= not_before)
    assert fleet.mint().status_code == 201


def test_webhook_without_signing_secret_refuses_to_start(gateway_stack: Stack) -> None:
    from gateways.app import GatewayApp
    from gateways.server import GatewayProtocol
    from tests.support.gateway_stack import gateway_settings

    settings = gateway_settings(gateway_stack, "echo", VALETKEY_ALERT_WEBHOOK_URL="http://127.0.0.1:9/hook")
    app = GatewayApp(settings, gateway_stack.policies.upstreams["echo"])
    server = ThreadedServer(app, http=GatewayProtocol)
    with pytest.raises(RuntimeError):
        server.start()
    server.stop()
    assert "VALETKEY_ALERT_WEBHOOK_SECRET" in app.startup_error


def test_stale_state_fails_closed_and_recovers(fleet: Fleet) -> None:
    """Runs last in this module: it restarts the fleet's Redis."""
    token = fleet.mint().json()["env"]["ECHO_TOKEN"]
    for replica in fleet.replicas:
        assert fleet.get(replica, token).status_code == 200
    fleet.redis.stop()
    try:
        for replica in fleet.replicas:
            eventually(lambda r=replica: fleet.get(r, token).json().get("error") == "revocation_state_stale")
            ready = httpx.get(f"{replica}/.valetkey/readyz")
            assert (ready.status_code, ready.json()["checks"]["revocations"]) == (503, False)
    finally:
        fleet.redis.start()
    for replica in fleet.replicas:
        eventually(lambda r=replica: fleet.get(r, token).status_code == 200, seconds=10)
