"""Faults in the data plane's dependencies, reproduced with real servers: Redis stopped and
restarted under a serving gateway (the audit trail), Vault stopped (break-glass revocation), Vault
restarted empty and re-bootstrapped (the gateway recovers without a restart), start-up failure
(the exit code)."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from broker.settings import BrokerSettings
from gateways.app import GatewayApp
from gateways.audit import AuditRecord, AuditSink, Metrics
from gateways.server import GatewayProtocol
from gateways.settings import GatewaySettings
from tests.support.gateway_stack import ISSUER, Stack, generation_started, loopback_resolver
from tests.support.servers import ThreadedServer
from valetkey.bootstrap import open_client
from valetkey.dev.services import OpenBaoDev, RedisServer, free_port
from valetkey.dev.vault_seed import DevVault

VALETKEY = str(Path(sys.executable).parent / "valetkey")
ITEM = {"upstream": "echo", "purpose": "read_items"}
STREAM = "valetkey:audit"


def eventually(check: Callable[[], bool], seconds: float = 10.0, every: float = 0.05) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise AssertionError("condition not reached in time")


def gateway(stack: Stack, env: dict[str, str]) -> ThreadedServer:
    settings = GatewaySettings.from_env("echo", {"VALETKEY_ISSUER": ISSUER, "VALETKEY_READ_TIMEOUT": "2s",
                                                 **env})
    app = GatewayApp(settings, stack.policies.upstreams["echo"], resolver=loopback_resolver)
    return ThreadedServer(app, http=GatewayProtocol).start()


def get(url: str, token: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/items", headers={"Authorization": f"Bearer {token}"}, timeout=10)


def request_lines(redis_url: str) -> list[dict[str, Any]]:
    with redis.Redis.from_url(redis_url) as client:
        return [json.loads(fields[b"line"]) for _, fields in client.xrange(STREAM)
                if fields[b"kind"] == b"request"]


# --- the audit trail across a Redis restart ---------------------------------------------------


def test_audit_lines_sent_while_redis_is_down_reach_the_stream_in_order(gateway_stack: Stack) -> None:
    with RedisServer() as store:
        generation_started(store.url)
        server = gateway(gateway_stack, {
            "VAULT_ADDR": gateway_stack.vault.addr, "VAULT_TOKEN": gateway_stack.vault.gateway_token("echo"),
            "VALETKEY_REDIS_URL": store.url, "VALETKEY_BROKER_URL": gateway_stack.broker_url})
        token = gateway_stack.mint([ITEM])["env"]["ECHO_TOKEN"]
        sent: list[str] = []
        statuses: list[int] = []
        try:
            with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:

                def send(count: int) -> None:
                    for _ in range(count):
                        response = client.get(f"{server.url}/v1/items")
                        sent.append(response.headers["x-valetkey-request-id"])
                        statuses.append(response.status_code)

                send(40)
                store.stop()
                outage = time.monotonic()
                while time.monotonic() - outage < 4.0:  # past the 3 s freshness bound: refusals too
                    send(10)
                    time.sleep(0.05)
                during = len(sent) - 40
                store.start()
                send(40)
            eventually(lambda: len(request_lines(store.url)) >= len(sent), seconds=15)
            in_stream = [line["request_id"] for line in request_lines(store.url)]
        finally:
            server.stop()
    assert during > 0
    assert 503 in statuses  # the gateway refused while its revocation state was stale: audited too
    assert in_stream == sent, f"sent {len(sent)} ({during} while Redis was down), stream {len(in_stream)}"


def test_a_full_audit_buffer_drops_the_newest_and_counts_them() -> None:
    observed: list[str] = []

    async def observe(record: AuditRecord, run_expires: int) -> None:
        observed.append(record.request_id)

    async def case(store: RedisServer) -> tuple[AuditSink, list[str]]:
        client = redis.asyncio.Redis.from_url(store.url, socket_timeout=1.0)
        metrics = Metrics()
        sink = AuditSink(client, STREAM, 1000, metrics, buffer=10)
        sink.observer = observe
        await sink.start()
        await asyncio.to_thread(store.stop)
        ids = [f"r{i:02d}" for i in range(15)]
        for request_id in ids:
            sink.write(AuditRecord(request_id=request_id, upstream="echo", method="GET", path="/"))
        await asyncio.sleep(0.3)  # the writer fails and keeps its lines
        assert sink.pending == 10
        assert metrics.registry.get_sample_value("valetkey_gateway_audit_pending") == 10
        await asyncio.to_thread(store.start)
        for _ in range(200):  # at most 10 s
            if not sink.pending and len(observed) >= 10:
                break
            await asyncio.sleep(0.05)
        assert metrics.registry.get_sample_value("valetkey_gateway_audit_dropped_total",
                                                 {"upstream": "echo"}) == 5
        assert metrics.registry.get_sample_value("valetkey_gateway_audit_pending") == 0
        await sink.stop()
        await client.aclose()
        return sink, ids

    with RedisServer() as store:
        sink, ids = asyncio.run(case(store))
        in_stream = [line["request_id"] for line in request_lines(store.url)]
    assert (sink.dropped, sink.written) == (5, 10)
    assert in_stream == ids[:10]
    assert observed == ids[:10]  # the alert detectors see each line once it is in the stream


# --- Vault: a dev server of this test's own, stopped and restarted ----------------------------


@pytest.fixture
def own_vault(gateway_stack: Stack) -> Iterator[tuple[OpenBaoDev, DevVault]]:
    server = OpenBaoDev()
    server.start()
    try:
        yield server, bootstrap(server, gateway_stack)
    finally:
        server.close()


def bootstrap(server: OpenBaoDev, stack: Stack) -> DevVault:
    """Bootstrap, and give the echo upstream the secret its (shared) test server expects."""
    dev = DevVault.create(server.addr, server.root_token, stack.policies)
    ref = stack.policies.upstreams["echo"].secret
    with open_client(server.addr, server.root_token) as client:
        client.secrets.kv.v2.create_or_update_secret(
            path=ref.path, mount_point=ref.mount, secret={ref.field: stack.vault.secrets["echo"]})
    return dev


def broker_on(dev: DevVault, stack: Stack) -> ThreadedServer:
    from broker.app import create_app

    policy_dir = Path(stack.policies.upstreams["echo"].source).parent
    settings = BrokerSettings.from_env({
        "VAULT_ADDR": dev.addr, "VAULT_TOKEN": dev.broker_token, "VALETKEY_REDIS_URL": stack.redis_url,
        "VALETKEY_POLICY_DIR": str(policy_dir), "VALETKEY_ISSUER": ISSUER})
    return ThreadedServer(create_app(settings, stack.policies)).start()


def mint(broker_url: str, dev: DevVault) -> dict[str, Any]:
    response = httpx.post(f"{broker_url}/v1/runs", json={"grants": [ITEM]}, timeout=10,
                          headers={"X-Vault-Token": dev.runtime_token("tester")})
    response.raise_for_status()
    bundle: dict[str, Any] = response.json()
    return bundle


def test_break_glass_revokes_while_vault_is_stopped(gateway_stack: Stack,
                                                    own_vault: tuple[OpenBaoDev, DevVault]) -> None:
    server, dev = own_vault
    broker = broker_on(dev, gateway_stack)
    gw = gateway(gateway_stack, {"VAULT_ADDR": dev.addr, "VAULT_TOKEN": dev.gateway_token("echo"),
                                 "VALETKEY_REDIS_URL": gateway_stack.redis_url,
                                 "VALETKEY_BROKER_URL": broker.url})
    try:
        bundle = mint(broker.url, dev)
        token, run_id = bundle["env"]["ECHO_TOKEN"], bundle["run_id"]
        assert get(gw.url, token).status_code == 200
        server.stop()
        through_broker = httpx.post(f"{broker.url}/v1/revocations", timeout=10,
                                    headers={"X-Vault-Token": dev.admin_token},
                                    json={"scope": "run", "name": run_id, "reason": "incident"})
        assert (through_broker.status_code, through_broker.json()["error"]) == (503, "vault_unavailable")
        assert through_broker.json()["recorded"] is False
        assert get(gw.url, token).status_code == 200  # nothing was recorded: the run still works
        done = subprocess.run(
            [VALETKEY, "revoke", "--break-glass", "--redis", gateway_stack.redis_url, "--run", run_id,
             "--reason", "incident, vault down"],
            env={k: v for k, v in os.environ.items() if not k.startswith("VAULT_")},
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert f"by break-glass:{getpass.getuser()}" in done.stdout
        eventually(lambda: get(gw.url, token).json().get("error") == "token_revoked")
    finally:
        gw.stop()
        broker.stop()
    with redis.Redis.from_url(gateway_stack.redis_url) as client:
        lines = [json.loads(f[b"line"]) for _, f in client.xrevrange(STREAM, count=200)
                 if f[b"kind"] == b"revocation"]
    line = next(x for x in lines if x.get("run") == run_id)
    assert (line["event"], line["break_glass"], line["os_user"]) == ("revoke", True, getpass.getuser())


@pytest.mark.slow
@pytest.mark.parametrize("recovery", [
    pytest.param("same-ids-restored", id="same-role-id-and-secret-id-restored"),
    pytest.param("new-secret-id-file", id="same-role-id-new-secret-id-in-the-file"),
])
def test_a_gateway_recovers_when_vault_comes_back_empty_and_is_rebootstrapped(
    gateway_stack: Stack, own_vault: tuple[OpenBaoDev, DevVault], tmp_path: Path, recovery: str
) -> None:
    server, dev = own_vault
    role = "valetkey-gateway-echo"
    with open_client(dev.addr, dev.root_token) as client:
        role_id = client.auth.approle.read_role_id(role_name=role)["data"]["role_id"]
        secret_id = client.auth.approle.generate_secret_id(role_name=role)["data"]["secret_id"]
    secret_file = tmp_path / "secret-id"
    secret_file.write_text(secret_id)
    broker = broker_on(dev, gateway_stack)
    gw = gateway(gateway_stack, {
        "VAULT_ADDR": dev.addr, "VALETKEY_VAULT_ROLE_ID": role_id,
        "VALETKEY_VAULT_SECRET_ID_FILE": str(secret_file), "VALETKEY_REDIS_URL": gateway_stack.redis_url,
        "VALETKEY_BROKER_URL": broker.url, "VALETKEY_SECRET_REFRESH": "1s",
        "VALETKEY_SECRET_MAX_STALE": "2s"})
    try:
        token = mint(broker.url, dev)["env"]["ECHO_TOKEN"]
        assert get(gw.url, token).status_code == 200
        server.stop()  # dev mode: every token, role and secret is gone
        eventually(lambda: get(gw.url, token).json().get("error") == "secret_unavailable", seconds=15)
        server.start()
        bootstrap(server, gateway_stack)  # a new role id; the gateway's credentials are unknown here
        time.sleep(2.0)
        assert get(gw.url, token).json().get("error") == "secret_unavailable"
        with open_client(server.addr, server.root_token) as client:  # docs/operations.md, "Vault lost"
            client.auth.approle.update_role_id(role_name=role, role_id=role_id)
            if recovery == "same-ids-restored":
                client.auth.approle.create_custom_secret_id(role_name=role, secret_id=secret_id)
            else:  # the file is read again at each login; the old secret id stays unknown
                fresh = client.auth.approle.generate_secret_id(role_name=role)["data"]["secret_id"]
                secret_file.write_text(fresh)
        eventually(lambda: get(gw.url, token).status_code == 200, seconds=20)
    finally:
        gw.stop()
        broker.stop()


@pytest.mark.parametrize("workers", [pytest.param("1", id="one-process"), pytest.param("2", id="workers")])
def test_a_gateway_that_cannot_start_exits_1(gateway_stack: Stack, workers: str) -> None:
    policy_dir = Path(gateway_stack.policies.upstreams["echo"].source).parent
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("VAULT_")},
           "VAULT_ADDR": f"http://127.0.0.1:{free_port()}", "VAULT_TOKEN": "s.nothing-listens",
           "VALETKEY_REDIS_URL": gateway_stack.redis_url, "VALETKEY_POLICY_DIR": str(policy_dir),
           "VALETKEY_BROKER_URL": gateway_stack.broker_url, "VALETKEY_ISSUER": ISSUER,
           "VALETKEY_LISTEN": f"127.0.0.1:{free_port()}"}
    done = subprocess.run([VALETKEY, "gateway", "serve", "--upstream", "echo", "--workers", workers], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
