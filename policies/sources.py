"""Where an upstream's credential comes from: the ``source:`` block of an upstream policy.

``kv`` (the default) is one long-lived secret read from Vault KV (``secret:``). The other kinds
issue a credential as short-lived and narrow as the run, wherever the upstream supports it:

* ``github_app``: an installation access token per run, narrowed to the run's bound repositories
  and to the permissions its granted purposes need; the App JWT is signed by a Vault transit RSA
  key (or, as a fallback, with a PEM private key read from KV).
* ``oauth2``: an access token from an OAuth2 token endpoint (client credentials, or a delegated
  grant's refresh token held in Vault), shared by the runs of this upstream, refreshed ahead of
  expiry; a rotated refresh token is written back to Vault.
* ``vault_database``: a Vault database secrets engine lease per run (Postgres gateway).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


@dataclass(frozen=True)
class SecretRef:
    """A Vault KV v2 location: ``{mount}/data/{path}``, field ``field``."""

    mount: str
    path: str
    field: str

    @property
    def api_path(self) -> str:
        return f"{self.mount}/data/{self.path}"


class SourceKind(StrEnum):
    KV = "kv"
    GITHUB_APP = "github_app"
    OAUTH2 = "oauth2"
    VAULT_DATABASE = "vault_database"


class OAuthGrant(StrEnum):
    CLIENT_CREDENTIALS = "client_credentials"
    REFRESH_TOKEN = "refresh_token"  # noqa: S105 - a grant type name, not a secret


@dataclass(frozen=True)
class TransitRef:
    """A Vault transit key: ``{mount}/sign/{key}``."""

    mount: str
    key: str


@dataclass(frozen=True)
class KvPath:
    """A Vault KV v2 secret with several fields (``{mount}/data/{path}``)."""

    mount: str
    path: str


@dataclass(frozen=True)
class KvSource:
    kind: SourceKind = SourceKind.KV


@dataclass(frozen=True)
class GitHubAppSource:
    """``permissions``: purpose name -> the GitHub permissions (name -> read|write) it needs; a
    run's token gets the union over its granted purposes, nothing for a purpose not listed."""

    app_id: str
    installation_id: str
    api_url: str
    transit_key: TransitRef | None
    private_key: SecretRef | None
    repository_param: str = "repo"
    permissions: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    kind: SourceKind = SourceKind.GITHUB_APP


@dataclass(frozen=True)
class OAuth2Source:
    """``client``: KV fields ``client_id`` and ``client_secret``; ``refresh_token``: where the
    delegated grant's refresh token lives (refresh_token grant), rewritten when it rotates."""

    token_url: str
    grant: OAuthGrant
    client: KvPath
    refresh_token: SecretRef | None = None
    scope: str = ""
    kind: SourceKind = SourceKind.OAUTH2


@dataclass(frozen=True)
class VaultDatabaseSource:
    """``roles``: purpose name -> the Vault database role whose lease a run granted it gets."""

    mount: str
    roles: Mapping[str, str]
    kind: SourceKind = SourceKind.VAULT_DATABASE


CredentialSource = KvSource | GitHubAppSource | OAuth2Source | VaultDatabaseSource


def vault_access(source: CredentialSource, secret: SecretRef | None) -> tuple[tuple[str, str], ...]:
    """(Vault API path, capabilities as HCL) the gateway of an upstream with this source needs."""
    if isinstance(source, KvSource):
        return () if secret is None else ((secret.api_path, '["read"]'),)
    if isinstance(source, GitHubAppSource):
        if source.transit_key is not None:
            return ((f"{source.transit_key.mount}/sign/{source.transit_key.key}", '["update"]'),)
        return () if source.private_key is None else ((source.private_key.api_path, '["read"]'),)
    if isinstance(source, OAuth2Source):
        paths = [(f"{source.client.mount}/data/{source.client.path}", '["read"]')]
        if source.refresh_token is not None:  # a rotated refresh token is written back
            paths.append((source.refresh_token.api_path, '["read", "create", "update"]'))
        return tuple(paths)
    # only its own roles' leases (a bare sys/leases/revoke would let it revoke any lease)
    return tuple(path for role in sorted(set(source.roles.values())) for path in (
        (f"{source.mount}/creds/{role}", '["read"]'),
        (f"sys/leases/renew/{source.mount}/creds/{role}/*", '["update"]'),
        (f"sys/leases/revoke/{source.mount}/creds/{role}/*", '["update"]')))
