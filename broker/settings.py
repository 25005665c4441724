"""Broker settings, read once from the environment into a frozen object; bad values are named."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from broker.oidc_settings import OIDCSettings
from broker.proxy_settings import ProxySettings
from contract.env import (
    SettingsError,
    checked_url,
    directory,
    duration,
    int_setting,
    listen,
    redis_url_setting,
    required,
    url_list_setting,
)
from contract.secret import Secret
from policies.load import SHIPPED_POLICY_DIR


@dataclass(frozen=True)
class BrokerSettings:
    vault_addr: str
    vault_token: Secret
    redis_url: str
    policy_dir: Path
    issuer: str
    host: str = "127.0.0.1"
    port: int = 8400
    admin_policy: str = "valetkey-admin"
    transit_mount: str = "transit"
    signing_key: str = "valetkey-tokens"
    default_ttl: int = 900
    caller_cache_ttl: int = 30
    key_cache_ttl: int = 10
    audit_maxlen: int = 100_000
    # admission control of POST /v1/runs (broker/admission.py): mints served at once, mints
    # waiting for a slot, and how long one may wait; beyond either bound: 503 broker_overloaded
    mint_concurrency: int = 32
    mint_queue: int = 512
    mint_queue_wait: int = 10
    # connection pools: a call waits for a free connection rather than failing at the bound
    redis_max_connections: int = 64
    vault_max_connections: int = 64
    gateway_urls: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    gateway_url_template: str = "http://valetkey-gateway-{upstream}:8080"
    proxy: ProxySettings = field(default_factory=ProxySettings)  # broker/proxy_settings.py
    # the security console's cookies lose Secure and the __Host- prefix: plain-HTTP dev only
    console_insecure_cookies: bool = False
    console_oidc: OIDCSettings | None = None  # broker/oidc_settings.py: sign-in through a provider

    def gateway_url(self, upstream: str) -> str:
        return self.gateway_urls.get(upstream) or self.gateway_url_template.format(upstream=upstream)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BrokerSettings:
        env = os.environ if env is None else env
        address = env.get("VALETKEY_LISTEN", "127.0.0.1:8400")
        host, port = listen("VALETKEY_LISTEN", address)
        issuer = env.get("VALETKEY_ISSUER", f"http://{address}")
        return cls(
            vault_addr=url_list_setting(env, "VAULT_ADDR", "http://127.0.0.1:8200"),
            vault_token=Secret(required(env, "VAULT_TOKEN")),
            redis_url=redis_url_setting(env, "VALETKEY_REDIS_URL", "redis://127.0.0.1:6379/0"),
            policy_dir=directory(env, "VALETKEY_POLICY_DIR", SHIPPED_POLICY_DIR),
            issuer=checked_url("VALETKEY_ISSUER", issuer),
            host=host,
            port=port,
            admin_policy=env.get("VALETKEY_ADMIN_POLICY", "valetkey-admin"),
            transit_mount=env.get("VALETKEY_TRANSIT_MOUNT", "transit"),
            signing_key=env.get("VALETKEY_SIGNING_KEY", "valetkey-tokens"),
            default_ttl=duration(env, "VALETKEY_DEFAULT_TTL", "15m"),
            caller_cache_ttl=duration(env, "VALETKEY_CALLER_CACHE_TTL", "30s"),
            key_cache_ttl=duration(env, "VALETKEY_KEY_CACHE_TTL", "10s"),
            audit_maxlen=int_setting("VALETKEY_AUDIT_MAXLEN", env.get("VALETKEY_AUDIT_MAXLEN", "100000"),
                              1000, 100_000_000),
            mint_concurrency=int_setting("VALETKEY_MINT_CONCURRENCY",
                                  env.get("VALETKEY_MINT_CONCURRENCY", "32"), 1, 10_000),
            mint_queue=int_setting("VALETKEY_MINT_QUEUE", env.get("VALETKEY_MINT_QUEUE", "512"),
                                   0, 1_000_000),
            mint_queue_wait=duration(env, "VALETKEY_MINT_QUEUE_WAIT", "10s"),
            redis_max_connections=int_setting("VALETKEY_REDIS_MAX_CONNECTIONS",
                                       env.get("VALETKEY_REDIS_MAX_CONNECTIONS", "64"), 4, 100_000),
            vault_max_connections=int_setting("VALETKEY_VAULT_MAX_CONNECTIONS",
                                       env.get("VALETKEY_VAULT_MAX_CONNECTIONS", "64"), 4, 100_000),
            gateway_urls=MappingProxyType(_gateway_urls(env.get("VALETKEY_GATEWAY_URLS", ""))),
            gateway_url_template=env.get(
                "VALETKEY_GATEWAY_URL_TEMPLATE", "http://valetkey-gateway-{upstream}:8080"
            ),
            proxy=ProxySettings.from_env(env),
            console_insecure_cookies=_flag(env, "VALETKEY_CONSOLE_INSECURE_COOKIES"),
            console_oidc=OIDCSettings.from_env(env),
        )


def _flag(env: Mapping[str, str], key: str) -> bool:
    value = env.get(key, "").strip().lower()
    if value not in ("", "0", "false", "1", "true"):
        raise SettingsError(f"{key}: expected 1/true or 0/false")
    return value in ("1", "true")


def _gateway_urls(raw: str) -> dict[str, str]:
    """``github=http://127.0.0.1:9101,openai=http://127.0.0.1:9102`` → mapping."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, url = item.partition("=")
        if not sep or not name:
            raise SettingsError(f"VALETKEY_GATEWAY_URLS: {item!r} is not name=url")
        out[name.strip()] = checked_url("VALETKEY_GATEWAY_URLS", url.strip(), ("http", "https", "postgresql"))
    return out
