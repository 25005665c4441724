"""Run-scoped credential sources (the ``source:`` block of an upstream policy) and the per-run
cache that issues, refreshes and revokes their credentials (``cache.RunCredentials``)."""

from __future__ import annotations

from typing import Any

from contract.vault import VaultClient
from gateways.sources.base import RunCredentialSource
from policies.model import Upstream
from policies.sources import GitHubAppSource, OAuth2Source


def build_source(upstream: Upstream, vault: VaultClient, verify: Any = True) -> RunCredentialSource | None:
    """The source of an upstream's credential; None for ``kind: kv`` (the gateway's SecretStore).
    ``verify``: TLS verification for the source's own endpoints (a CA file's context, or True)."""
    # each source's client library is imported only by a gateway that has that source: authlib's
    # httpx integration alone is ~15 MB of a gateway's resident memory (docs/benchmarks.md, table 6)
    config = upstream.credential_source
    if isinstance(config, GitHubAppSource):
        import httpx

        from gateways.sources.github_app import GitHubApp

        return GitHubApp(config, vault, httpx.AsyncClient(timeout=10.0, trust_env=False, verify=verify))
    if isinstance(config, OAuth2Source):
        from gateways.sources.oauth2 import OAuth2

        return OAuth2(config, vault, verify=verify)
    return None
