"""The run bundle: what a sandbox runtime injects into the sandbox as environment variables."""

from __future__ import annotations

import shlex
from typing import Any
from urllib.parse import urlsplit

from broker.runs import RunRecord
from broker.settings import BrokerSettings
from policies.model import PolicySet


def render(
    record: RunRecord, tokens: dict[str, str], policies: PolicySet, settings: BrokerSettings
) -> dict[str, Any]:
    """For each upstream: placeholder var = that upstream's token, base-URL var = its gateway."""
    env: dict[str, str] = {}
    gateways: dict[str, str] = {}
    for upstream_name, token in tokens.items():
        upstream = policies.upstreams[upstream_name]
        gateway = settings.gateway_url(upstream_name).rstrip("/")
        gateways[upstream_name] = gateway
        env[upstream.env.placeholder] = token
        env[upstream.env.base_url] = (
            database_url(gateway, record.run_id, upstream.postgres.database)
            if upstream.postgres is not None else gateway + upstream.env.base_path)
    # for tools inside the sandbox (``valetkey selftest``): which gateways this run may use
    env["VALETKEY_RUN_ID"] = record.run_id
    env["VALETKEY_GATEWAYS"] = ",".join(f"{name}={url}" for name, url in sorted(gateways.items()))
    return {
        "run_id": record.run_id,
        "runtime": record.runtime,
        "expires_at": record.expires,
        "expires_in": record.expires - record.created,
        "grants": record.grants,
        "gateways": gateways,
        "env": env,
        "dotenv": dotenv(env),
    }


def database_url(gateway: str, run_id: str, database: str) -> str:
    """A Postgres gateway's URL for the sandbox: user = the run id, the password is the token in
    the placeholder variable (PGPASSWORD), ``sslmode`` from the configured gateway URL (default
    ``require``: the token never crosses a network in the clear)."""
    parts = urlsplit(gateway)
    query = parts.query or "sslmode=require"
    return f"postgresql://{run_id}@{parts.netloc}/{database}?{query}"


def dotenv(env: dict[str, str]) -> str:
    """``KEY=value`` lines, shell-quoted, sorted; safe to ``source`` or pass to ``--env-file``."""
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in sorted(env.items()))
