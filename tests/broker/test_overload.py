"""The broker under a burst of mints and with Vault out of reach: it serves at its capacity, sheds
the rest fast with ``503 broker_overloaded``, stays ready, and blames the right party."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from bench.mints_curve import OVERLOADED, burst
from broker.app import create_app
from broker.callers import CallerAuthenticator
from contract.secret import Secret
from contract.vault import VaultClient
from tests.support.broker_stack import broker_settings
from tests.support.servers import ThreadedServer
from valetkey.dev.services import free_port

GRANTS = {"grants": [{"upstream": "slack", "purpose": "post_message"}], "ttl": "5m"}
BURST = 400  # scaled down from the 2,000 of the report (bench/mints_curve.py measures those)


def test_a_mint_burst_is_served_or_shed_fast_and_the_broker_stays_ready(
    bootstrapped_vault: Any, redis_server: Any
) -> None:
    # a small bound, so the burst overruns it on any machine
    settings = broker_settings(bootstrapped_vault, redis_server.url, VALETKEY_MINT_CONCURRENCY="8",
                               VALETKEY_MINT_QUEUE="40")
    token = bootstrapped_vault.runtime_token("notifier")
    with ThreadedServer(create_app(settings)) as server:
        first = asyncio.run(burst(server.url, token, GRANTS, BURST, limit=60.0, ready_every=0.05))
        again = asyncio.run(burst(server.url, token, GRANTS, 20, limit=30.0))
        jwks = httpx.get(f"{server.url}/.well-known/jwks.json", timeout=5.0)

    assert first.other == {}, "every answer is a 201 or a 503 broker_overloaded"
    assert first.created >= 8, first.summary()
    assert first.overloaded, first.summary()
    assert all(a.retry_after == "1" for a in first.overloaded)
    # shed before any work: refusals come back sooner than the mints that were served
    assert first.summary()["overloaded_ms"]["p50"] < first.summary()["created_ms"]["p50"]
    assert first.readyz
    assert all(status == 200 for status, _ in first.readyz), first.readyz
    assert again.created == 20, again.summary()
    assert jwks.status_code == 200


def test_an_overloaded_answer_says_when_to_retry(bootstrapped_vault: Any, redis_server: Any) -> None:
    settings = broker_settings(bootstrapped_vault, redis_server.url, VALETKEY_MINT_CONCURRENCY="1",
                               VALETKEY_MINT_QUEUE="0")
    token = bootstrapped_vault.runtime_token("notifier")
    with ThreadedServer(create_app(settings)) as server:
        result = asyncio.run(burst(server.url, token, GRANTS, 30, limit=30.0))
    refused = result.overloaded
    assert refused
    assert result.other == {}
    assert {a.error for a in refused} == {OVERLOADED}
    assert result.created >= 1


@pytest.mark.anyio
async def test_concurrent_lookups_of_one_token_share_one_vault_call(bootstrapped_vault: Any,
                                                                    shipped_policies: Any) -> None:
    vault = VaultClient(bootstrapped_vault.addr, Secret(bootstrapped_vault.broker_token))
    callers = CallerAuthenticator(vault, shipped_policies, "valetkey-admin", 30)
    headers = {"x-vault-token": bootstrapped_vault.runtime_token("notifier")}
    try:
        found = await asyncio.gather(*(callers.authenticate(headers) for _ in range(50)))
    finally:
        await vault.aclose()
    assert {c.name for c in found} == {"notifier"}
    assert vault.calls == 1


@pytest.mark.parametrize(
    ("vault_addr", "broker_token", "status", "reason"),
    [
        pytest.param("unreachable", None, 503, "vault_unavailable", id="vault-unreachable"),
        pytest.param(None, "s.revoked", 503, "vault_unavailable", id="broker-token-refused"),
        pytest.param(None, None, 401, "unknown_caller", id="caller-token-invalid"),
    ],
)
def test_a_caller_vault_cannot_look_up_gets_503_not_401(
    bootstrapped_vault: Any, redis_server: Any, vault_addr: str | None, broker_token: str | None,
    status: int, reason: str,
) -> None:
    extra = {"VAULT_ADDR": f"http://127.0.0.1:{free_port()}"} if vault_addr else {}
    if broker_token:
        extra["VAULT_TOKEN"] = broker_token
    settings = broker_settings(bootstrapped_vault, redis_server.url, **extra)
    caller = "s.not-a-token" if status == 401 else bootstrapped_vault.admin_token
    with ThreadedServer(create_app(settings)) as server:
        response = httpx.post(f"{server.url}/v1/revocations", headers={"X-Vault-Token": caller},
                              json={"scope": "runtime", "name": "notifier"}, timeout=10.0)
    body = response.json()
    assert (response.status_code, body["error"]) == (status, reason)
    if status == 503:  # a revocation refused by a dependency says it was not recorded
        assert body["recorded"] is False
        assert "NOT recorded" in body["detail"]
