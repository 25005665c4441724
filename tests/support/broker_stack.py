"""Broker fixtures: a real broker under uvicorn, backed by the session's OpenBao and Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from broker.app import create_app
from broker.runs import RunRegistry
from broker.settings import BrokerSettings
from contract.jwks import KeyCache, http_fetcher
from contract.verify import TokenVerifier
from policies.load import SHIPPED_POLICY_DIR
from tests.support.servers import ThreadedServer
from valetkey.dev.services import RedisServer

ISSUER = "http://broker.valetkey.test"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Broker:
    url: str
    settings: BrokerSettings
    vault: Any  # the bootstrapped_vault fixture object

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"X-Vault-Token": token} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10.0)

    def mint(self, runtime: str, grants: list[dict[str, Any]], **body: Any) -> httpx.Response:
        with self.client(self.vault.runtime_token(runtime)) as client:
            return client.post("/v1/runs", json={"grants": grants, **body})

    @asynccontextmanager
    async def verifier(self, audience: str, **kwargs: Any) -> AsyncIterator[TokenVerifier]:
        """A gateway-side verifier: JWKS over HTTP from this broker, run check in Redis."""
        redis = aioredis.Redis.from_url(self.settings.redis_url)
        async with httpx.AsyncClient() as http:
            keys = KeyCache(http_fetcher(f"{self.url}/.well-known/jwks.json", http),
                            min_refresh_interval=kwargs.pop("min_refresh_interval", 5.0))
            await keys.start()
            try:
                yield TokenVerifier(issuer=ISSUER, audience=audience, keys=keys,
                                    run_check=RunRegistry(redis).require_live, **kwargs)
            finally:
                await keys.stop()
                await redis.aclose()


def broker_settings(vault: Any, redis_url: str, **extra: str) -> BrokerSettings:
    env = {
        "VAULT_ADDR": vault.addr,
        "VAULT_TOKEN": vault.broker_token,
        "VALETKEY_REDIS_URL": redis_url,
        "VALETKEY_POLICY_DIR": str(SHIPPED_POLICY_DIR),
        "VALETKEY_ISSUER": ISSUER,
        "VALETKEY_GATEWAY_URLS": "github=http://127.0.0.1:9101,openai=http://127.0.0.1:9102",
        "VALETKEY_GATEWAY_URL_TEMPLATE": "http://gateway-{upstream}.valetkey.test:8080",
        **extra,
    }
    return BrokerSettings.from_env(env)


@pytest.fixture(scope="session")
def broker(bootstrapped_vault: Any, redis_server: Any) -> Iterator[Broker]:
    settings = broker_settings(bootstrapped_vault, redis_server.url)
    with ThreadedServer(create_app(settings)) as server:
        yield Broker(server.url, settings, bootstrapped_vault)


@pytest.fixture(scope="module")
def isolated_broker(bootstrapped_vault: Any) -> Iterator[Broker]:
    """A broker with a redis-server of its own: for fuzzing as the security team, whose
    revocations (even of everything) must reach no other test's broker or gateway."""
    with RedisServer() as redis:
        settings = broker_settings(bootstrapped_vault, redis.url)
        with ThreadedServer(create_app(settings)) as server:
            yield Broker(server.url, settings, bootstrapped_vault)
