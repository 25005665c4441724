"""A GitHub App installation, as GitHub's REST API treats one (docs.github.com/rest/apps).

``POST /app/installations/{id}/access_tokens`` authenticates the App with a JWT: RS256, checked
against the App's public key, ``iss`` = the App id, ``iat``/``exp`` present and ``exp`` at most
10 minutes ahead. The body may narrow the token to ``repositories`` (names in the installation)
and ``permissions`` (each at most what the installation has); asking for more is ``422``. The
token (``ghs_…``) expires after ``token_ttl`` seconds (GitHub: one hour). ``DELETE
/installation/token`` revokes the token it is called with (``204``).

A token is honoured only for its repositories (another repository is ``404 Not Found``, as on
GitHub, which does not confirm that a repository exists) and its permissions (``403 Resource not
accessible by integration``): narrowing is proven at the upstream, not in the gateway.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import RSAKey

LEVELS = {"read": 1, "write": 2, "admin": 3}
MAX_JWT_AHEAD = 600  # GitHub: exp no more than 10 minutes into the future
SKEW = 60
DOCS = "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app"


@dataclass
class InstallationToken:
    token: str
    repositories: frozenset[str]
    permissions: Mapping[str, str]
    expires_at: float


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str


@dataclass
class AppInstallation:
    """One App (``app_id``, its public key) installed on ``owner`` with ``repositories`` and
    ``permissions`` (the most any of its tokens may have)."""

    app_id: str
    installation_id: str
    public_key: RSAKey
    owner: str
    repositories: dict[str, int]  # name -> id
    permissions: Mapping[str, str]
    token_ttl: float = 3600.0
    clock: Callable[[], float] = time.time
    tokens: dict[str, InstallationToken] = field(default_factory=dict)
    issued: int = 0
    revoked: int = 0

    def create_token(self, app_jwt: str | None, installation_id: str,
                     body: Any) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) of ``POST /app/installations/{id}/access_tokens``."""
        problem = self._check_jwt(app_jwt)
        if problem is not None:
            return 401, {"message": problem, "documentation_url": DOCS, "status": "401"}
        if installation_id != self.installation_id:
            return 404, {"message": "Not Found", "documentation_url": DOCS, "status": "404"}
        if not isinstance(body, dict):
            body = {}
        names = body.get("repositories", list(self.repositories))
        perms = body.get("permissions", dict(self.permissions))
        if (not isinstance(names, list) or not all(isinstance(n, str) for n in names)
                or any(n not in self.repositories for n in names)):
            return 422, {"message": "There is at least one repository that does not exist or is not "
                         "accessible to the parent installation.", "documentation_url": DOCS,
                         "status": "422"}
        if not isinstance(perms, dict) or any(LEVELS.get(str(v), 99) > LEVELS.get(
                self.permissions.get(k, ""), 0) for k, v in perms.items()):
            return 422, {"message": "The permissions requested are not granted to this installation.",
                         "documentation_url": DOCS, "status": "422"}
        token = "ghs_" + secrets.token_urlsafe(27).replace("-", "a").replace("_", "b")[:36]
        expires = self.clock() + self.token_ttl
        self.tokens[token] = InstallationToken(token, frozenset(names), dict(perms), expires)
        self.issued += 1
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
        return 201, {"token": token, "expires_at": stamp, "permissions": dict(perms),
                     "repository_selection": "selected",
                     "repositories": [{"id": self.repositories[n], "name": n,
                                       "full_name": f"{self.owner}/{n}"} for n in sorted(names)]}

    def _check_jwt(self, app_jwt: str | None) -> str | None:
        if not app_jwt:
            return "A JSON web token could not be decoded"
        try:
            token = jwt.decode(app_jwt, self.public_key, algorithms=["RS256"])
        except (JoseError, ValueError):
            return "A JSON web token could not be decoded"
        claims, now = token.claims, self.clock()
        iat, exp = claims.get("iat"), claims.get("exp")
        if not isinstance(iat, int) or not isinstance(exp, int):
            return "Missing 'issued at' or 'expiration time' claim"
        if str(claims.get("iss")) != self.app_id:
            return "'Issuer' claim ('iss') must be an Integer"
        if iat > now + SKEW:
            return "'Issued at' claim ('iat') must be an Integer representing a time in the past"
        if exp <= now:
            return "'Expiration time' claim ('exp') must be a numeric value representing the future time"
        if exp > now + MAX_JWT_AHEAD + SKEW:
            return "'Expiration time' claim ('exp') is too far in the future"
        return None

    def valid(self, token: str | None) -> InstallationToken | None:
        found = self.tokens.get(token or "")
        if found is None:
            return None
        if found.expires_at <= self.clock():
            del self.tokens[found.token]
            return None
        return found

    def revoke(self, token: str | None) -> bool:
        if self.valid(token) is None:
            return False
        del self.tokens[token or ""]
        self.revoked += 1
        return True

    def check(self, token: str | None, owner: str, repo: str, permission: str,
              level: str) -> Refusal | None:
        """None if ``token`` may use ``permission`` at ``level`` on ``owner/repo``."""
        found = self.valid(token)
        if found is None:
            return Refusal(401, "Bad credentials")
        if owner != self.owner or repo not in found.repositories:
            return Refusal(404, "Not Found")
        if permission == "metadata" and level == "read":  # every installation token has it
            return None
        if LEVELS.get(found.permissions.get(permission, ""), 0) < LEVELS[level]:
            return Refusal(403, "Resource not accessible by integration")
        return None
