"""The run bundle: what a sandbox runtime injects into the sandbox (environment and files).

Without a proxy: per upstream, placeholder var = that upstream's token, base-URL var = its gateway.
With a proxy (``VALETKEY_PROXY_URL``) the bundle also carries

* ``HTTPS_PROXY``/``HTTP_PROXY`` (and lower case) = ``http://run:<proxy token>@host:port``,
  ``VALETKEY_PROXY`` = the proxy URL without credentials;
* ``NO_PROXY``/``no_proxy``: empty with ``VALETKEY_EGRESS=proxy``; with ``gateway`` or ``both``
  the hosts of the run's gateways, which are reached directly, never through the proxy;
* the CA file: ``files = {VALETKEY_SANDBOX_CA_PATH: PEM}`` and every variable common clients read
  for one (``CA_VARS``) set to that path. npm gets its own (``npm_config_cafile``): a ``cafile``
  in a global npmrc (common in images) makes npm ignore ``NODE_EXTRA_CA_CERTS``; the file holds
  the public roots too, so naming it as npm's only store loses nothing.

``VALETKEY_EGRESS=proxy`` drops the base-URL variables (clients use their default hosts, through
the proxy); placeholders stay, as the only credentials in the bundle.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from broker.proxy_settings import Egress
from broker.runs import RunRecord
from broker.settings import BrokerSettings
from policies.model import PolicySet

PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT",
           "NODE_EXTRA_CA_CERTS", "npm_config_cafile", "AWS_CA_BUNDLE", "CARGO_HTTP_CAINFO", "DENO_CERT")


@dataclass(frozen=True)
class ProxyPart:
    token: str  # the run's proxy token
    ca_pem: str  # the CA file: proxy CA certs, then the trusted roots


def render(
    record: RunRecord, tokens: dict[str, str], policies: PolicySet, settings: BrokerSettings,
    proxy: ProxyPart | None = None,
) -> dict[str, Any]:
    """``tokens``: upstream name → its token (the proxy token comes in ``proxy``)."""
    env: dict[str, str] = {}
    gateways: dict[str, str] = {}
    base_urls = proxy is None or settings.proxy.egress is not Egress.PROXY
    for upstream_name, token in tokens.items():
        upstream = policies.upstreams[upstream_name]
        env[upstream.env.placeholder] = token
        if base_urls or upstream.postgres is not None:  # psql never goes through an HTTP proxy
            gateway = settings.gateway_url(upstream_name).rstrip("/")
            gateways[upstream_name] = gateway
            env[upstream.env.base_url] = (
                database_url(gateway, record.run_id, upstream.postgres.database)
                if upstream.postgres is not None else gateway + upstream.env.base_path)
    files: dict[str, str] = {}
    if proxy is not None:
        files[settings.proxy.sandbox_ca_path] = proxy.ca_pem
        env.update(proxy_env(settings, proxy.token, gateways))
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
        "files": files,
    }


def proxy_env(settings: BrokerSettings, token: str, gateways: dict[str, str]) -> dict[str, str]:
    url = settings.proxy.url_with(token)
    direct = ",".join(sorted({urlsplit(g).hostname or "" for g in gateways.values()} - {""}))
    env = {var: url for var in PROXY_VARS}
    env.update({var: direct for var in NO_PROXY_VARS})
    env.update({var: settings.proxy.sandbox_ca_path for var in CA_VARS})
    env["VALETKEY_PROXY"] = settings.proxy.url
    return env


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
