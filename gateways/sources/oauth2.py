"""OAuth2 access tokens from the upstream's token endpoint, with authlib's client.

``client_credentials``: the gateway's own client id and secret (Vault KV) buy an access token.
``refresh_token``: a delegated grant's refresh token, held in Vault, buys one; when the provider
rotates it, the new refresh token is written back to Vault (check-and-set) before anything else,
so a restarted gateway does not hold a spent one. One access token serves every run of the
upstream (``shared``): the sandbox's placeholder is its run token and never changes; the cache
refreshes the access token ahead of its expiry, off the request path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.httpx_client import AsyncOAuth2Client

from contract.claims import AccessClaims
from contract.errors import ValetkeyError
from contract.secret import Secret
from contract.vault import VaultClient
from gateways.sources.base import IssuedCredential, expiry_id, refused, unavailable
from policies.sources import OAuth2Source, OAuthGrant

log = logging.getLogger("valetkey.gateway")
KIND = "oauth2_access_token"
DEFAULT_LIFETIME = 3600  # seconds, when the provider does not say (expires_in is RECOMMENDED only)
TIMEOUT = 10.0  # seconds (authlib passes it on per request: a float, not an httpx.Timeout)


class OAuth2:
    kind = KIND
    shared = True

    def __init__(self, config: OAuth2Source, vault: VaultClient, verify: Any = True,
                 clock: Callable[[], float] = time.time,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._config = config
        self._vault = vault
        self._verify = verify
        self._clock = clock
        self._transport = transport
        self._client: AsyncOAuth2Client | None = None
        self._refresh_token: Secret | None = None
        self._unsaved: Secret | None = None  # a rotated refresh token Vault has not taken yet
        self.rotations = 0  # refresh tokens rotated and written back (tests)

    def __repr__(self) -> str:
        return f"OAuth2(token_url={self._config.token_url!r}, grant={self._config.grant.value})"

    async def start(self) -> None:
        fields, _ = await self._vault.kv_read_fields(self._config.client.mount, self._config.client.path)
        client_id, secret = fields.get("client_id"), fields.get("client_secret")
        if client_id is None:
            raise refused(f"the OAuth client at {self._config.client.mount}/{self._config.client.path} "
                          "has no client_id", 404)
        self._client = AsyncOAuth2Client(
            client_id.reveal(), secret.reveal() if secret else None, scope=self._config.scope or None,
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
            timeout=TIMEOUT, verify=self._verify, trust_env=False, transport=self._transport)
        if self._config.refresh_token is not None:
            self._refresh_token = await self._vault.kv_read(self._config.refresh_token)

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def issue(self, claims: AccessClaims) -> IssuedCredential:
        return await self._fetch()

    async def refresh(self, claims: AccessClaims, current: IssuedCredential) -> IssuedCredential:
        return await self._fetch()

    async def revoke(self, credential: IssuedCredential) -> None:
        return None  # shared by every run: it expires on its own

    async def _fetch(self) -> IssuedCredential:
        client = self._client
        if client is None:
            raise unavailable("the OAuth2 source is not started")
        url = self._config.token_url
        try:
            if self._config.grant is OAuthGrant.CLIENT_CREDENTIALS:
                token = await client.fetch_token(url, grant_type="client_credentials")
            else:
                if self._refresh_token is None:
                    raise unavailable("no refresh token was read from Vault")
                token = await client.refresh_token(url, refresh_token=self._refresh_token.reveal())
        except OAuthError as exc:
            raise refused(f"the token endpoint answered {exc.error or 'an error'}", 400) from None
        except httpx.HTTPError:
            raise unavailable("the OAuth2 token endpoint") from None
        except (ValueError, KeyError, TypeError):
            raise refused("the token endpoint answered something that is not a token", 200) from None
        access = token.get("access_token")
        if not isinstance(access, str) or not access:
            raise refused("a token answer without access_token", 200)
        await self._keep_refresh_token(token.get("refresh_token"))
        expires_at = float(token.get("expires_at") or self._clock() + DEFAULT_LIFETIME)
        return IssuedCredential(Secret(access), KIND, expiry_id(expires_at), expires_at)

    async def _keep_refresh_token(self, rotated: Any) -> None:
        """A rotated refresh token replaces the old one here at once (the old one is spent) and in
        Vault; a failed write is retried at the next refresh, never lost."""
        if self._config.refresh_token is None:
            return
        if isinstance(rotated, str) and rotated and (
                self._refresh_token is None or rotated != self._refresh_token.reveal()):
            self._refresh_token = self._unsaved = Secret(rotated)
        if self._unsaved is None:
            return
        try:
            await self._vault.kv_write_field(self._config.refresh_token, self._unsaved)
        except ValetkeyError as exc:
            log.error('{"event":"refresh_token_write_failed","path":"%s","reason":"%s"}',
                      self._config.refresh_token.api_path, exc.code)
            return
        self._unsaved = None
        self.rotations += 1
