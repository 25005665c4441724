"""GitHub App installation tokens, one per run, narrowed to the run's repositories and purposes.

The App authenticates with a JWT (RS256, ``iss`` = App id, at most 10 minutes) signed by a Vault
transit RSA key, so the private key never leaves Vault; a PEM in KV is the documented fallback
(signed here with joserfc). Each run gets ``POST /app/installations/{id}/access_tokens`` with
``repositories`` = the repositories its grants bind (``repository_param``, a ``.git`` suffix
dropped) and ``permissions`` = the union of what its granted purposes need (``permissions:`` in
the policy): GitHub itself refuses anything outside them. ``DELETE /installation/token`` revokes
it. A refresh is a new token (the cache revokes the one it replaced).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx
from joserfc import jwt
from joserfc.jwk import RSAKey

from contract.claims import AccessClaims, b64url
from contract.errors import Forbidden, Reason
from contract.secret import Secret
from contract.vault import VaultClient
from gateways.sources.base import IssuedCredential, expiry_id, refused, unavailable
from policies.sources import GitHubAppSource

KIND = "github_installation_token"
APP_JWT_LIFETIME = 540  # seconds; GitHub allows 600, minus clock skew
APP_JWT_BACKDATE = 60  # iat a minute early, as GitHub recommends for clock drift
APP_JWT_REUSE = 420  # an App JWT is reused for this long (one transit signature per 7 minutes)
LEVELS = {"read": 1, "write": 2, "admin": 3}
API_HEADERS = {"accept": "application/vnd.github+json", "x-github-api-version": "2022-11-28",
               "user-agent": "valetkey-gateway"}


def narrowed(config: GitHubAppSource, claims: AccessClaims) -> tuple[list[str], dict[str, str]]:
    """(repository names, permissions) a run's token gets: only what its grants bind and need."""
    repos: set[str] = set()
    perms: dict[str, str] = {}
    for grant in claims.grants:
        repo = grant.params.get(config.repository_param)
        if repo:
            repos.add(repo.removesuffix(".git"))
        for name, level in config.permissions.get(grant.purpose, {}).items():
            if LEVELS[level] > LEVELS.get(perms.get(name, ""), 0):
                perms[name] = level
    return sorted(repos), dict(sorted(perms.items()))


class GitHubApp:
    kind = KIND
    shared = False

    def __init__(self, config: GitHubAppSource, vault: VaultClient, http: httpx.AsyncClient,
                 clock: Any = time.time) -> None:
        self._config = config
        self._vault = vault
        self._http = http
        self._clock = clock
        self._jwt: tuple[float, Secret] | None = None
        self._pem_key: RSAKey | None = None
        self.signatures = 0  # App JWTs signed (tests, bench)

    def __repr__(self) -> str:
        return f"GitHubApp(app={self._config.app_id}, installation={self._config.installation_id})"

    async def start(self) -> None:
        await self._app_jwt()  # a key Vault cannot sign with fails at start-up, not at a first request

    async def stop(self) -> None:
        await self._http.aclose()

    async def _app_jwt(self) -> Secret:
        now = self._clock()
        if self._jwt is not None and now - self._jwt[0] < APP_JWT_REUSE:
            return self._jwt[1]
        claims = {"iat": int(now) - APP_JWT_BACKDATE, "exp": int(now) + APP_JWT_LIFETIME,
                  "iss": self._config.app_id}
        transit = self._config.transit_key
        if transit is not None:
            header = b64url(json.dumps({"alg": "RS256", "typ": "JWT"}, separators=(",", ":")).encode())
            body = b64url(json.dumps(claims, separators=(",", ":")).encode())
            signing_input = f"{header}.{body}"
            signature = await self._vault.transit_sign_rs256(transit.mount, transit.key,
                                                             signing_input.encode())
            token = f"{signing_input}.{b64url(signature)}"
        else:
            if self._pem_key is None:
                ref = self._config.private_key
                if ref is None:
                    raise unavailable("the GitHub App has no private key configured")
                pem = await self._vault.kv_read(ref)
                self._pem_key = RSAKey.import_key(pem.reveal())
            token = jwt.encode({"alg": "RS256", "typ": "JWT"}, claims, self._pem_key, algorithms=["RS256"])
        self.signatures += 1
        self._jwt = (now, Secret(token))
        return self._jwt[1]

    async def issue(self, claims: AccessClaims) -> IssuedCredential:
        repos, perms = narrowed(self._config, claims)
        if not repos:
            raise Forbidden("no repository is bound by this run's grants; a GitHub App token is "
                            "issued only for bound repositories", Reason.PURPOSE_NOT_GRANTED)
        app_jwt = await self._app_jwt()
        url = f"{self._config.api_url}/app/installations/{self._config.installation_id}/access_tokens"
        body = {"repositories": repos, "permissions": perms}
        answer = await self._call("POST", url, app_jwt, body, "creating an installation token")
        if answer.status_code == 401:
            self._jwt = None  # a rotated App key: sign again next time
        if answer.status_code != 201:
            raise refused("creating a GitHub installation token", answer.status_code)
        try:
            data = answer.json()
            token, expires = data["token"], data["expires_at"]
            expires_at = datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError, AttributeError):
            raise refused("an installation token answer without token and expires_at", 201) from None
        if not isinstance(token, str) or not token:
            raise refused("an installation token answer without token", 201)
        return IssuedCredential(Secret(token), KIND, expiry_id(expires_at), expires_at)

    async def refresh(self, claims: AccessClaims, current: IssuedCredential) -> IssuedCredential:
        return await self.issue(claims)

    async def revoke(self, credential: IssuedCredential) -> None:
        answer = await self._call("DELETE", f"{self._config.api_url}/installation/token",
                                  credential.value, None, "revoking an installation token")
        if answer.status_code not in (204, 401):  # 401: already expired or revoked
            raise refused("revoking a GitHub installation token", answer.status_code)

    async def _call(self, method: str, url: str, bearer: Secret, body: Mapping[str, Any] | None,
                    what: str) -> httpx.Response:
        headers = {**API_HEADERS, "authorization": f"Bearer {bearer.reveal()}"}
        try:
            return await self._http.request(method, url, headers=headers, json=body)
        except httpx.HTTPError:
            raise unavailable(what) from None
