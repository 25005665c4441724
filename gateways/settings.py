"""Gateway settings, read once from the environment into a frozen object; bad values are named."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from contract import keys
from contract.claims import MAX_LEEWAY
from contract.env import (
    SettingsError,
    checked_url,
    directory,
    duration,
    int_setting,
    listen,
    redis_url_setting,
    url_list_setting,
    url_setting,
)
from contract.secret import Secret
from policies.load import SHIPPED_POLICY_DIR


@dataclass(frozen=True)
class GatewaySettings:
    upstream: str
    vault_addr: str
    vault_token: Secret | None
    approle_role_id: str
    approle_secret_id: Secret | None
    redis_url: str
    policy_dir: Path
    broker_url: str
    issuer: str
    host: str = "127.0.0.1"
    port: int = 8080
    secret_refresh: int = 60
    secret_max_stale: int = 600
    jwks_max_age: int = 300
    jwks_max_stale: int = 900
    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    total_timeout: float = 900.0
    default_max_body: int = 16 * 1024 * 1024
    upstream_ca_file: str | None = None
    broker_ca_file: str | None = None
    revocation_max_stale: float = 3.0
    token_leeway: int = 5  # clock skew tolerated on a run token's exp/nbf/iat
    metrics_listen: tuple[str, int] | None = None  # a /metrics port the sandbox cannot reach
    alert_webhook_url: str = ""
    alert_webhook_secret: Secret | None = None
    audit_stream: str = keys.AUDIT_STREAM
    audit_maxlen: int = 100_000
    audit_buffer: int = 100_000  # audit lines held for the stream while Redis is unreachable
    approle_secret_id_file: str = ""  # read again at every AppRole login (a restored Vault)
    redis_max_connections: int = 64  # one pool shared by budgets, audit, alerts and revocations
    max_connections: int = 4096  # client connections per process; more are answered 503 and closed
    header_timeout: int = 10  # a request head must arrive within this, from connect or its first byte
    keepalive_timeout: int = 5  # an idle kept-alive client connection is closed after this
    upstream_max_connections: int = 256  # per process
    approval_per_run: int = 4  # requests of one run waiting for a person at once (all replicas)
    approval_max_held: int = 256  # held requests per process (each keeps its body in memory)
    console_url: str = ""  # where approvers decide: linked from the webhook's approval notice

    def __post_init__(self) -> None:
        if self.jwks_max_stale < self.jwks_max_age:
            raise SettingsError(f"VALETKEY_JWKS_MAX_STALE: {self.jwks_max_stale}s is shorter than "
                                f"VALETKEY_JWKS_MAX_AGE ({self.jwks_max_age}s); make it at least as long")

    @classmethod
    def from_env(cls, upstream: str, env: Mapping[str, str] | None = None) -> GatewaySettings:
        env = os.environ if env is None else env
        address = env.get("VALETKEY_LISTEN", "127.0.0.1:8080")
        host, port = listen("VALETKEY_LISTEN", address)
        token = env.get("VAULT_TOKEN", "")
        role_id = env.get("VALETKEY_VAULT_ROLE_ID", "")
        secret_id = _secret_id(env)
        if not token and not (role_id and secret_id):
            raise SettingsError(
                "set VALETKEY_VAULT_ROLE_ID and VALETKEY_VAULT_SECRET_ID (or _FILE) for AppRole, "
                "or VAULT_TOKEN in development"
            )
        broker_url = url_setting(env, "VALETKEY_BROKER_URL", "http://127.0.0.1:8400")
        return cls(
            upstream=upstream,
            vault_addr=url_list_setting(env, "VAULT_ADDR", "http://127.0.0.1:8200"),
            vault_token=Secret(token) if token else None,
            approle_role_id=role_id,
            approle_secret_id=secret_id,
            redis_url=redis_url_setting(env, "VALETKEY_REDIS_URL", "redis://127.0.0.1:6379/0"),
            policy_dir=directory(env, "VALETKEY_POLICY_DIR", SHIPPED_POLICY_DIR),
            broker_url=broker_url,
            issuer=checked_url("VALETKEY_ISSUER", env.get("VALETKEY_ISSUER", broker_url)),
            host=host,
            port=port,
            secret_refresh=duration(env, "VALETKEY_SECRET_REFRESH", "60s"),
            secret_max_stale=duration(env, "VALETKEY_SECRET_MAX_STALE", "10m"),
            jwks_max_age=duration(env, "VALETKEY_JWKS_MAX_AGE", "5m"),
            jwks_max_stale=duration(env, "VALETKEY_JWKS_MAX_STALE", "15m"),
            connect_timeout=float(duration(env, "VALETKEY_CONNECT_TIMEOUT", "5s")),
            read_timeout=float(duration(env, "VALETKEY_READ_TIMEOUT", "120s")),
            total_timeout=float(duration(env, "VALETKEY_TOTAL_TIMEOUT", "15m")),
            upstream_ca_file=_ca_file(env, "VALETKEY_UPSTREAM_CA_FILE"),
            broker_ca_file=_ca_file(env, "VALETKEY_BROKER_CA_FILE"),
            revocation_max_stale=float(duration(env, "VALETKEY_REVOCATION_MAX_STALE", "3s")),
            token_leeway=int_setting("VALETKEY_TOKEN_LEEWAY", env.get("VALETKEY_TOKEN_LEEWAY", "5"), 0,
                                     MAX_LEEWAY),
            metrics_listen=_listen(env, "VALETKEY_METRICS_LISTEN"),
            alert_webhook_url=checked_url("VALETKEY_ALERT_WEBHOOK_URL", env["VALETKEY_ALERT_WEBHOOK_URL"])
            if env.get("VALETKEY_ALERT_WEBHOOK_URL") else "",
            alert_webhook_secret=Secret(env["VALETKEY_ALERT_WEBHOOK_SECRET"])
            if env.get("VALETKEY_ALERT_WEBHOOK_SECRET") else None,
            audit_maxlen=int_setting("VALETKEY_AUDIT_MAXLEN", env.get("VALETKEY_AUDIT_MAXLEN", "100000"),
                              1000, 100_000_000),
            approle_secret_id_file=env.get("VALETKEY_VAULT_SECRET_ID_FILE", ""),
            audit_buffer=int_setting("VALETKEY_AUDIT_BUFFER", env.get("VALETKEY_AUDIT_BUFFER", "100000"),
                              0, 10_000_000),
            redis_max_connections=int_setting("VALETKEY_REDIS_MAX_CONNECTIONS",
                                       env.get("VALETKEY_REDIS_MAX_CONNECTIONS", "64"), 4, 10_000),
            max_connections=int_setting("VALETKEY_MAX_CONNECTIONS",
                                        env.get("VALETKEY_MAX_CONNECTIONS", "4096"), 1, 1_000_000),
            header_timeout=duration(env, "VALETKEY_HEADER_TIMEOUT", "10s"),
            keepalive_timeout=duration(env, "VALETKEY_KEEPALIVE_TIMEOUT", "5s"),
            upstream_max_connections=int_setting("VALETKEY_UPSTREAM_MAX_CONNECTIONS",
                                          env.get("VALETKEY_UPSTREAM_MAX_CONNECTIONS", "256"), 1, 100_000),
            approval_per_run=int_setting("VALETKEY_APPROVAL_PER_RUN",
                                         env.get("VALETKEY_APPROVAL_PER_RUN", "4"), 1, 1000),
            approval_max_held=int_setting("VALETKEY_APPROVAL_MAX_HELD",
                                          env.get("VALETKEY_APPROVAL_MAX_HELD", "256"), 1, 100_000),
            console_url=checked_url("VALETKEY_CONSOLE_URL", env["VALETKEY_CONSOLE_URL"])
            if env.get("VALETKEY_CONSOLE_URL") else "",
        )


def _listen(env: Mapping[str, str], key: str) -> tuple[str, int] | None:
    value = env.get(key, "")
    if not value:
        return None
    host, port = listen(key, value)
    if port == 0:
        raise SettingsError(f"{key}: 0 is outside 1..65535")
    return host, port


def _ca_file(env: Mapping[str, str], key: str) -> str | None:
    path = env.get(key, "")
    if path and not Path(path).is_file():
        raise SettingsError(f"{key}: {path!r} is not a file")
    return path or None


def _secret_id(env: Mapping[str, str]) -> Secret | None:
    value = env.get("VALETKEY_VAULT_SECRET_ID", "")
    path = env.get("VALETKEY_VAULT_SECRET_ID_FILE", "")
    if path:
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SettingsError(f"VALETKEY_VAULT_SECRET_ID_FILE: cannot read {path!r}: {exc}") from None
    return Secret(value) if value else None
