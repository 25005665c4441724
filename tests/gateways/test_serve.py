"""The gateway as a service: start-up refusals, TLS to the upstream, dead upstreams, and
`valetkey gateway serve` as a real process logging in with its AppRole identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import hvac
import pytest

from gateways.app import GatewayApp
from gateways.server import GatewayProtocol
from tests.support.gateway_stack import Stack, gateway_settings, start_gateway
from tests.support.servers import ThreadedServer
from valetkey.dev.services import free_port

VALETKEY = str(Path(sys.executable).parent / "valetkey")


def _get(stack: Stack, name: str, gateway_url: str) -> httpx.Response:
    bundle = stack.mint([{"upstream": name, "purpose": "read_items"}])
    token = bundle["env"][f"{name.upper()}_TOKEN"]
    return httpx.get(f"{gateway_url}/v1/items", headers={"Authorization": f"Bearer {token}"}, timeout=10)


def test_tls_upstream_verified_for_policy_hostname_via_sni(gateway_stack: Stack) -> None:
    server = start_gateway(gateway_stack, "tlsgood", VALETKEY_UPSTREAM_CA_FILE=str(gateway_stack.ca_file))
    try:
        response = _get(gateway_stack, "tlsgood", server.url)
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    seen = gateway_stack.upstreams["tlsgood"].seen[-1]
    assert seen.header("host") == [f"api.valetkey.test:{gateway_stack.upstreams['tlsgood'].port}"]
    assert seen.header("authorization") == [f"Bearer {gateway_stack.vault.secrets['tlsgood']}"]


def test_tls_certificate_for_another_name_is_refused(gateway_stack: Stack) -> None:
    server = start_gateway(gateway_stack, "tlsbad", VALETKEY_UPSTREAM_CA_FILE=str(gateway_stack.ca_file))
    try:
        before = len(gateway_stack.upstreams["tlsbad"].seen)
        response = _get(gateway_stack, "tlsbad", server.url)
    finally:
        server.stop()
    assert (response.status_code, response.json()["error"]) == (502, "upstream_tls_error")
    assert len(gateway_stack.upstreams["tlsbad"].seen) == before  # no request got through
    assert gateway_stack.vault.secrets["tlsbad"] not in response.text


def test_untrusted_ca_is_refused(gateway_stack: Stack) -> None:
    server = start_gateway(gateway_stack, "tlsgood")  # system CAs only: our test CA is unknown
    try:
        response = _get(gateway_stack, "tlsgood", server.url)
    finally:
        server.stop()
    assert (response.status_code, response.json()["error"]) == (502, "upstream_tls_error")


def test_unreachable_upstream_is_502(gateway_stack: Stack) -> None:
    server = start_gateway(gateway_stack, "gone")
    try:
        response = _get(gateway_stack, "gone", server.url)
    finally:
        server.stop()
    assert (response.status_code, response.json()["error"]) == (502, "upstream_unreachable")


def test_hostname_resolving_to_loopback_is_refused_without_allow_private(gateway_stack: Stack) -> None:
    """`localhost` really resolves (system resolver) to loopback; the policy does not allow it."""
    app = GatewayApp(gateway_settings(gateway_stack, "nolocal"), gateway_stack.policies.upstreams["nolocal"])
    server = ThreadedServer(app, http=GatewayProtocol)
    with pytest.raises(RuntimeError):
        server.start()
    server.stop()
    assert app.startup_error.startswith("dest_loopback")
    assert gateway_stack.upstreams["nolocal"].connections == 0


def test_gateway_serve_process_with_approle(gateway_stack: Stack, tmp_path: Path) -> None:
    client = hvac.Client(url=gateway_stack.vault.addr, token=gateway_stack.vault.root_token)
    role = "valetkey-gateway-echo"
    role_id = client.auth.approle.read_role_id(role_name=role)["data"]["role_id"]
    secret_id = client.auth.approle.generate_secret_id(role_name=role)["data"]["secret_id"]
    client.adapter.close()
    secret_file = tmp_path / "secret-id"
    secret_file.write_text(secret_id)
    port = free_port()
    policy_dir = Path(gateway_stack.policies.upstreams["echo"].source).parent
    env = {k: v for k, v in os.environ.items() if k != "VAULT_TOKEN"}
    env.update({
        "VAULT_ADDR": gateway_stack.vault.addr, "VALETKEY_VAULT_ROLE_ID": role_id,
        "VALETKEY_VAULT_SECRET_ID_FILE": str(secret_file), "VALETKEY_REDIS_URL": gateway_stack.redis_url,
        "VALETKEY_BROKER_URL": gateway_stack.broker_url, "VALETKEY_POLICY_DIR": str(policy_dir),
        "VALETKEY_ISSUER": "http://broker.gateway-tests.valetkey.test", "VALETKEY_LISTEN": f"127.0.0.1:{port}",
    })
    log = tmp_path / "gateway.log"
    with log.open("w") as out:
        proc = subprocess.Popen([VALETKEY, "gateway", "serve", "--upstream", "echo"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/.valetkey/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        else:
            raise AssertionError(log.read_text())
        response = _get(gateway_stack, "echo", url)
        assert response.status_code == 200, response.text
        denied = httpx.get(f"{url}/v1/items")
        assert denied.json()["error"] == "missing_token"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    audit = [line for line in lines if "request_id" in line and "event" not in line]
    assert {line["reason"] for line in audit} >= {"ok", "missing_token"}
    text = log.read_text()
    assert secret_id not in text
    assert gateway_stack.vault.secrets["echo"] not in text


def test_serve_refuses_unknown_upstream_and_missing_identity() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "VALETKEY_"))}
    no_identity = subprocess.run([VALETKEY, "gateway", "serve", "--upstream", "github"], env=env,
                                 capture_output=True, text=True, timeout=60, check=False)
    assert no_identity.returncode == 1
    assert "VALETKEY_VAULT_ROLE_ID" in no_identity.stderr
    unknown = subprocess.run([VALETKEY, "gateway", "serve", "--upstream", "nope"],
                             env={**env, "VAULT_TOKEN": "x"}, capture_output=True, text=True, timeout=60,
                             check=False)
    assert unknown.returncode == 1
    assert "no upstream 'nope'" in unknown.stderr
