"""The broker as a process: `valetkey broker serve`, the CLI against it, health and OpenAPI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.load import SHIPPED_POLICY_DIR
from tests.support.broker_stack import Broker
from valetkey.dev.services import free_port

VALETKEY = str(Path(sys.executable).parent / "valetkey")


@pytest.fixture(scope="module")
def served(bootstrapped_vault: Any, redis_server: Any, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log = tmp_path_factory.mktemp("broker") / "broker.log"
    env = {
        **os.environ, "VAULT_ADDR": bootstrapped_vault.addr, "VAULT_TOKEN": bootstrapped_vault.broker_token,
        "VALETKEY_REDIS_URL": redis_server.url, "VALETKEY_POLICY_DIR": str(SHIPPED_POLICY_DIR),
        "VALETKEY_LISTEN": f"127.0.0.1:{port}", "VALETKEY_ISSUER": "http://broker.valetkey.test",
    }
    with log.open("w") as out:
        proc = subprocess.Popen([VALETKEY, "broker", "serve"], env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        else:
            raise AssertionError(f"broker did not start: {log.read_text()}")
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run_cli(vault: Any, runtime: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VAULT_TOKEN": vault.runtime_token(runtime)}
    return subprocess.run([VALETKEY, "run", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_cli_create_show_end(served: tuple[str, Path], bootstrapped_vault: Any) -> None:
    url, log = served
    created = run_cli(bootstrapped_vault, "coding-agent", "create", "--broker", url, "--format", "env",
                      "--grant", "github:read_issues:owner=acme,repo=widgets", "--grant", "openai:chat",
                      "--ttl", "5m")
    assert created.returncode == 0, created.stderr
    lines = dict(line.split("=", 1) for line in created.stdout.splitlines())
    assert set(lines) == {"VALETKEY_RUN_ID", "VALETKEY_GATEWAYS", "GITHUB_TOKEN", "GITHUB_API_URL",
                          "OPENAI_API_KEY", "OPENAI_BASE_URL"}
    run_id = lines["VALETKEY_RUN_ID"]
    shown = run_cli(bootstrapped_vault, "coding-agent", "show", "--broker", url, run_id)
    assert "state    active" in shown.stdout
    ended = run_cli(bootstrapped_vault, "coding-agent", "end", "--broker", url, run_id)
    assert ended.stdout.strip() == f"run {run_id} ended"
    text = log.read_text()
    assert "run_created" in text
    assert "run_ended" in text
    assert lines["GITHUB_TOKEN"] not in text


def test_cli_reports_refusal(served: tuple[str, Path], bootstrapped_vault: Any) -> None:
    url, _ = served
    refused = run_cli(bootstrapped_vault, "notifier", "create", "--broker", url,
                      "--grant", "github:read_repo")
    assert refused.returncode == 1
    assert "403 purpose_not_allowed" in refused.stderr


def test_serve_refuses_bad_settings() -> None:
    env = {**os.environ, "VAULT_TOKEN": "x", "VALETKEY_LISTEN": "nope:port"}
    result = subprocess.run([VALETKEY, "broker", "serve"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 1
    assert "VALETKEY_LISTEN" in result.stderr


@pytest.mark.parametrize(("path", "status", "field", "value"), [
    pytest.param("/healthz", 200, "status", "ok", id="healthz"),
    pytest.param("/readyz", 200, "status", "ready", id="readyz"),
    pytest.param("/openapi.json", 200, "openapi", "3.1.0", id="openapi"),
    pytest.param("/nope", 404, "error", "not_found", id="unknown-route"),
])
def test_endpoints(broker: Broker, path: str, status: int, field: str, value: str) -> None:
    with broker.client() as client:
        response = client.get(path)
    assert (response.status_code, response.json()[field]) == (status, value)


def test_wrong_method_is_json(broker: Broker) -> None:
    with broker.client() as client:
        response = client.put("/v1/runs")
    assert (response.status_code, response.json()["error"]) == (405, "method_not_allowed")


def test_readyz_fails_closed_without_redis(bootstrapped_vault: Any) -> None:
    from broker.app import create_app
    from tests.support.broker_stack import broker_settings
    from tests.support.servers import ThreadedServer

    settings = broker_settings(bootstrapped_vault, f"redis://127.0.0.1:{free_port()}/0")
    with ThreadedServer(create_app(settings)) as server:
        response = httpx.get(f"{server.url}/readyz")
        assert response.status_code == 503
        assert response.json()["checks"] == {"vault": True, "vault_token": True, "redis": False}
        minted = httpx.post(f"{server.url}/v1/runs", json={"grants": [{"upstream": "slack",
                            "purpose": "post_message"}]},
                            headers={"X-Vault-Token": bootstrapped_vault.runtime_token("notifier")})
        assert (minted.status_code, minted.json()["error"]) == (503, "redis_unavailable")


def test_readyz_fails_when_the_broker_token_is_refused(bootstrapped_vault: Any, redis_server: Any) -> None:
    from broker.app import create_app
    from tests.support.broker_stack import broker_settings
    from tests.support.servers import ThreadedServer

    settings = broker_settings(bootstrapped_vault, redis_server.url)
    settings = type(settings)(**{**settings.__dict__, "vault_token": type(settings.vault_token)("s.revoked")})
    with ThreadedServer(create_app(settings)) as server:
        response = httpx.get(f"{server.url}/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["vault_token"] is False


def test_openapi_document_is_valid_and_complete(broker: Broker) -> None:
    from openapi_spec_validator import validate

    with broker.client() as client:
        document = client.get("/openapi.json").json()
    validate(document)
    assert set(document["paths"]) >= {"/v1/runs", "/v1/runs/{run_id}", "/v1/runs/{run_id}/audit",
                                      "/v1/revocations", "/v1/revocations/{scope}/{name}",
                                      "/v1/revocations/all", "/.well-known/jwks.json"}
