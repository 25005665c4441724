"""Signing in to the console through an OpenID Connect provider: authorization code with PKCE.

    begin() -> (authorization URL, state)     state, nonce and the PKCE verifier are kept in Redis
                                              (``valetkey:console:oidc:<sha256 of state>``, ten
                                              minutes, single use); the state also goes to the
                                              browser in a cookie, so a callback is this browser's
    finish(state, code) -> Caller             the state taken (once) from Redis; the code exchanged
                                              with the verifier (authlib's client, client secret
                                              basic); the ID token verified with joserfc in two
                                              explicit steps: the signature against the provider's
                                              JWKS (an algorithm allowlist; keys re-read once for
                                              an unknown ``kid``), then the claims (iss, aud, azp,
                                              exp, iat, nonce; small leeway, ``now`` injectable);
                                              its groups mapped to the security team or approver
                                              groups

Errors: ``oidc_state_invalid`` (400), ``oidc_token_invalid`` (401), ``oidc_provider_unavailable``
(503), ``not_approver`` (403: signed in, but in no group the console knows). Discovery must name
the configured issuer. Nothing of the provider's tokens is kept: only the session it leads to.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx
import redis.asyncio as aioredis
from authlib.common.security import generate_token
from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.httpx_client import AsyncOAuth2Client
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from broker.callers import Caller
from broker.console_auth import OIDC_STATE_PREFIX, redis_call
from broker.oidc_settings import OIDCSettings
from contract.errors import BadRequest, Forbidden, Reason, TokenInvalid, Unavailable
from contract.secret import Secret
from contract.vault import VaultClient

STATE_TTL = 600
ALGORITHMS = ["RS256", "PS256", "ES256", "EdDSA"]  # never "none", never a MAC with a public key
SCOPE = "openid profile groups"
LEEWAY = 60
METADATA_TTL = 3600
TIMEOUT = 10.0
WHAT = "console sign-in state"


def _invalid(detail: str) -> TokenInvalid:
    return TokenInvalid(detail, check="oidc", reason=Reason.OIDC_TOKEN_INVALID)


class OIDCClient:
    def __init__(self, settings: OIDCSettings, vault: VaultClient, redis: aioredis.Redis,
                 clock: Callable[[], float] = time.time, verify: Any = True) -> None:
        self.settings = settings
        self._vault, self._redis, self._clock = vault, redis, clock
        self._http = httpx.AsyncClient(timeout=TIMEOUT, trust_env=False, verify=verify)
        self._verify = verify
        self._metadata: tuple[float, dict[str, Any]] | None = None
        self._keys: tuple[float, KeySet] | None = None
        self._secret: Secret | None = settings.client_secret if settings.client_secret.reveal() else None

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, url: str) -> dict[str, Any]:
        try:
            response = await self._http.get(url)
            response.raise_for_status()
            value = response.json()
        except (httpx.HTTPError, ValueError):
            raise Unavailable("the OIDC provider did not answer", Reason.OIDC_PROVIDER_UNAVAILABLE) from None
        if not isinstance(value, dict):
            raise Unavailable("the OIDC provider answered no JSON object", Reason.OIDC_PROVIDER_UNAVAILABLE)
        return value

    async def metadata(self) -> dict[str, Any]:
        if self._metadata is None or self._clock() - self._metadata[0] > METADATA_TTL:
            found = await self._get(f"{self.settings.issuer}/.well-known/openid-configuration")
            if found.get("issuer") != self.settings.issuer:
                raise Unavailable("the provider's discovery names another issuer",
                                  Reason.OIDC_PROVIDER_UNAVAILABLE)
            self._metadata = (self._clock(), found)
        return self._metadata[1]

    async def _key_set(self, fresh: bool = False) -> KeySet:
        if fresh or self._keys is None or self._clock() - self._keys[0] > METADATA_TTL:
            raw = await self._get(str((await self.metadata())["jwks_uri"]))
            try:
                self._keys = (self._clock(), KeySet.import_key_set(raw))  # type: ignore[arg-type]
            except (JoseError, ValueError, TypeError, KeyError):
                raise Unavailable("the provider's JWKS is not a key set",
                                  Reason.OIDC_PROVIDER_UNAVAILABLE) from None
        return self._keys[1]

    async def _client_secret(self) -> Secret:
        if self._secret is None and self.settings.secret_vault is not None:
            mount, path, field = self.settings.secret_vault
            fields, _ = await self._vault.kv_read_fields(mount, path)
            if field not in fields:
                raise Unavailable(f"no field {field!r} at {mount}/{path}", Reason.OIDC_PROVIDER_UNAVAILABLE)
            self._secret = fields[field]
        return self._secret or Secret("")

    async def _oauth(self) -> AsyncOAuth2Client:
        secret = await self._client_secret()
        return AsyncOAuth2Client(self.settings.client_id, secret.reveal(), scope=SCOPE,
                                 redirect_uri=self.settings.redirect_url, code_challenge_method="S256",
                                 token_endpoint_auth_method="client_secret_basic",  # noqa: S106 - a method name
                                 timeout=TIMEOUT,
                                 verify=self._verify, trust_env=False)

    async def begin(self) -> tuple[str, str]:
        meta = await self.metadata()
        state, nonce, verifier = secrets.token_urlsafe(32), secrets.token_urlsafe(32), generate_token(64)
        held = json.dumps({"nonce": nonce, "verifier": verifier})
        await redis_call(self._redis.set(OIDC_STATE_PREFIX + _hash(state), held, ex=STATE_TTL), WHAT)
        async with await self._oauth() as client:
            url, _ = client.create_authorization_url(str(meta["authorization_endpoint"]), state=state,
                                                     nonce=nonce, code_verifier=verifier)
        return url, state

    async def finish(self, state: str, code: str) -> Caller:
        key = OIDC_STATE_PREFIX + _hash(state)
        saved = await redis_call(self._redis.getdel(key), WHAT) if state else None
        if saved is None or not code:
            raise BadRequest("this sign-in is unknown, used or expired: start again",
                             Reason.OIDC_STATE_INVALID)
        held = json.loads(saved)
        meta = await self.metadata()
        try:
            async with await self._oauth() as client:
                token = await client.fetch_token(str(meta["token_endpoint"]), code=code,
                                                 code_verifier=held["verifier"])
        except OAuthError as exc:
            raise _invalid(f"the provider refused the code ({exc.error})") from None
        except httpx.HTTPError:
            raise Unavailable("the provider's token endpoint did not answer",
                              Reason.OIDC_PROVIDER_UNAVAILABLE) from None
        claims = await self.verify(str(token.get("id_token") or ""), held["nonce"])
        return self.caller(claims)

    async def verify(self, id_token: str, nonce: str) -> dict[str, Any]:
        """Signature first (the allowlisted algorithms, the provider's keys), claims second."""
        try:
            decoded = jwt.decode(id_token, await self._key_set(), algorithms=ALGORITHMS)
        except JoseError:
            try:  # a key the provider rotated in since we read its JWKS: read it once more
                decoded = jwt.decode(id_token, await self._key_set(fresh=True), algorithms=ALGORITHMS)
            except JoseError as exc:
                raise _invalid(f"the ID token's signature does not verify ({exc.error})") from None
        except ValueError:
            raise _invalid("the ID token is malformed") from None
        registry = jwt.JWTClaimsRegistry(
            now=int(self._clock()), leeway=LEEWAY,
            iss={"essential": True, "value": self.settings.issuer},
            aud={"essential": True, "value": self.settings.client_id},
            sub={"essential": True}, exp={"essential": True}, iat={"essential": True},
            nonce={"essential": True, "value": nonce})
        try:
            registry.validate(decoded.claims)
        except JoseError as exc:
            raise _invalid(f"the ID token's claims are not valid ({exc.error}: {exc.description})") from None
        aud = decoded.claims["aud"]
        if isinstance(aud, list) and len(aud) > 1 and decoded.claims.get("azp") != self.settings.client_id:
            raise _invalid("the ID token names several audiences and another authorized party")
        return dict(decoded.claims)

    def caller(self, claims: dict[str, Any]) -> Caller:
        raw = claims.get(self.settings.groups_claim, [])
        theirs = {g for g in raw if isinstance(g, str)} if isinstance(raw, list) else set()
        is_admin = bool(theirs & self.settings.admin_groups)
        groups = frozenset(ours for g, ours in self.settings.approver_groups.items() if g in theirs)
        name = str(claims.get("preferred_username") or claims.get("email") or claims["sub"])[:120]
        if not is_admin and not groups:
            raise Forbidden("signed in, but in no group that may use the console", Reason.NOT_APPROVER)
        return Caller(name=f"oidc:{name}", runtime=None, is_admin=is_admin, groups=groups)



def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()
