"""What every broker route works with: the services built once at start-up, and the caller.

``Services`` holds the broker's clients (Vault, Redis) and the stores over them; routes reach it
through ``services(request)``. ``authenticate`` maps the request's Vault token to a ``Caller``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from starlette.requests import Request

from broker.callers import Caller, CallerAuthenticator
from broker.oidc_client import OIDCClient
from broker.proxy_trust import ProxyTrust
from broker.revocation_keeper import RevocationKeeper
from broker.runs import RunRegistry
from broker.settings import BrokerSettings
from broker.signer import TransitSigner
from contract import redis_url
from contract.approvals import ApprovalStore
from contract.env import SettingsError
from contract.revocations import RevocationStore, in_policy
from contract.vault import VaultClient
from policies.load import load_policy_dir
from policies.model import PolicySet

REDIS_POOL_WAIT = 5.0  # seconds a Redis call may wait for a free connection of the pool
log = logging.getLogger("valetkey.broker")


@dataclass
class Services:
    settings: BrokerSettings
    policies: PolicySet
    vault: VaultClient
    redis: aioredis.Redis
    runs: RunRegistry
    signer: TransitSigner
    callers: CallerAuthenticator
    revocations: RevocationStore
    approvals: ApprovalStore
    keeper: RevocationKeeper
    proxy_trust: ProxyTrust | None = None  # the bundle's CA file, when a proxy is configured
    oidc: OIDCClient | None = None  # the console's OIDC sign-in, when a provider is configured

    @classmethod
    def build(cls, settings: BrokerSettings, policies: PolicySet | None = None) -> Services:
        policies = policies or load_policy_dir(settings.policy_dir)
        if settings.proxy.enabled and policies.target(settings.proxy.audience) is not None:
            raise SettingsError(f"VALETKEY_PROXY_AUDIENCE={settings.proxy.audience} is also the name of "
                                "an upstream or destination: audiences must not collide")
        vault = VaultClient(settings.vault_addr, settings.vault_token,
                            max_connections=settings.vault_max_connections)
        # redis-py's default pool fails a call at once beyond 100 connections ("Too many
        # connections": 503 for every mint past the hundredth of a burst); this one waits
        client = redis_url.async_client(settings.redis_url, max_connections=settings.redis_max_connections,
                                        pool_timeout=REDIS_POOL_WAIT)
        return cls(
            settings=settings, policies=policies, vault=vault, redis=client,
            runs=RunRegistry(client),
            signer=TransitSigner(
                vault, settings.transit_mount, settings.signing_key, settings.key_cache_ttl
            ),
            callers=CallerAuthenticator(
                vault, policies, settings.admin_policy, settings.caller_cache_ttl
            ),
            revocations=RevocationStore(client, require_generation=True), approvals=ApprovalStore(client),
            keeper=RevocationKeeper(client, vault, known=in_policy(policies)),
            proxy_trust=ProxyTrust(vault, settings.proxy) if settings.proxy.enabled else None,
            oidc=OIDCClient(settings.console_oidc, vault, client) if settings.console_oidc else None,
        )

    async def aclose(self) -> None:
        if self.oidc is not None:
            await self.oidc.aclose()
        await self.vault.aclose()
        await self.redis.aclose()


def event(name: str, **fields: Any) -> None:
    """One JSON log line per broker event; never pass a token or secret here."""
    log.info(json.dumps({"event": name, "time": round(time.time(), 3), **fields}))


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


async def authenticate(request: Request) -> Caller:
    return await services(request).callers.authenticate(request.headers)
