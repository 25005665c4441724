"""A demo OpenID Connect provider on authlib's authorization server, for the console's OIDC sign-in.

The authorization code flow with PKCE (``S256``, required) and a required ``nonce``; ID tokens
signed RS256 with a key published at ``jwks_uri`` (``kid`` in the header); discovery at
``/.well-known/openid-configuration``. ``users`` maps a user name to its groups (the ``groups``
claim). The authorization page is a form on which a person picks whom to sign in as, as a real
provider's login page would ask for a password: the browser test clicks it.
"""

from __future__ import annotations

import html
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from authlib.oauth2.rfc6749 import AuthorizationServer, ClientMixin, OAuth2Error, OAuth2Request, grants
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import UserInfo
from authlib.oidc.core.grants import OpenIDCode
from joserfc.jwk import RSAKey
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route, Router
from starlette.types import Receive, Scope, Send

ID_TOKEN_TTL = 300
SCOPES = ("openid", "profile", "groups")


@dataclass
class Client(ClientMixin):  # type: ignore[misc]
    client_id: str
    client_secret: str
    redirect_uris: tuple[str, ...]

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str:
        return self.redirect_uris[0]

    def get_allowed_scope(self, scope: str) -> str:
        return " ".join(s for s in (scope or "").split() if s in SCOPES)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        return secrets.compare_digest(client_secret.encode(), self.client_secret.encode())

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "authorization_code"


@dataclass
class Code:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    user: str
    nonce: str
    code_challenge: str
    code_challenge_method: str
    auth_time: int = field(default_factory=lambda: int(time.time()))

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope

    def get_nonce(self) -> str:
        return self.nonce

    def get_auth_time(self) -> int:
        return self.auth_time

    def get_acr(self) -> None:
        return None

    def get_amr(self) -> None:
        return None


class _CodeGrant(grants.AuthorizationCodeGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]  # noqa: RUF012

    def save_authorization_code(self, code: str, request: OAuth2Request) -> None:
        data = request.payload.data
        self.server.provider.codes[code] = Code(
            code, request.client.client_id, request.payload.redirect_uri, request.scope, request.user,
            data.get("nonce", ""), data.get("code_challenge", ""), data.get("code_challenge_method", ""))

    def query_authorization_code(self, code: str, client: Client) -> Code | None:
        found: Code | None = self.server.provider.codes.get(code)
        return found if found is not None and found.client_id == client.client_id else None

    def delete_authorization_code(self, authorization_code: Code) -> None:
        self.server.provider.codes.pop(authorization_code.code, None)

    def authenticate_user(self, authorization_code: Code) -> str:
        return authorization_code.user


class _IdToken(OpenIDCode):  # type: ignore[misc]
    def __init__(self, provider: OIDCProvider) -> None:
        super().__init__(require_nonce=True)
        self.provider = provider

    def exists_nonce(self, nonce: str, request: OAuth2Request) -> bool:
        return any(c.nonce == nonce for c in self.provider.codes.values())

    def resolve_client_private_key(self, client: Client) -> RSAKey:
        return self.provider.key

    def get_client_algorithm(self, client: Client) -> str:
        return "RS256"

    def get_encode_header(self, client: Client) -> dict[str, str]:
        return {"alg": "RS256", "kid": self.provider.kid}

    def get_client_claims(self, client: Client) -> dict[str, Any]:
        now = int(time.time())
        return {"iss": self.provider.issuer, "aud": [client.client_id], "iat": now, "exp": now + ID_TOKEN_TTL}

    def generate_user_info(self, user: str, scope: str) -> UserInfo:
        return UserInfo(sub=user, name=user, groups=list(self.provider.users.get(user, ())))


class _Request(OAuth2Request):  # type: ignore[misc]
    def __init__(self, method: str, uri: str, headers: Any, query: dict[str, str],
                 form: dict[str, str]) -> None:
        super().__init__(method, uri, headers=headers)
        self.payload = BasicOAuth2Payload({**query, **form})
        self._query, self._form = query, form

    @property
    def args(self) -> dict[str, str]:
        return self._query

    @property
    def form(self) -> dict[str, str]:
        return self._form


class _Server(AuthorizationServer):  # type: ignore[misc]
    def __init__(self, provider: OIDCProvider) -> None:
        super().__init__(scopes_supported=list(SCOPES))
        self.provider = provider

    def query_client(self, client_id: str) -> Client | None:
        return self.provider.clients.get(client_id)

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        return None  # the console uses the ID token only

    def create_oauth2_request(self, request: _Request) -> OAuth2Request:
        return request

    def handle_response(self, status: int, body: Any, headers: Any) -> Response:
        location = dict(headers).get("Location")
        if status in (302, 303) and location:
            return RedirectResponse(location, status_code=303)
        return JSONResponse(body, status, dict(headers))

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class OIDCProvider:
    """``issuer``: this provider's URL as the ID tokens and discovery name it."""

    issuer: str = ""
    users: dict[str, tuple[str, ...]] = field(default_factory=dict)
    clients: dict[str, Client] = field(default_factory=dict)
    codes: dict[str, Code] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.key = RSAKey.generate_key(2048, private=True)
        self.kid = secrets.token_hex(8)
        self.server = _Server(self)
        self.server.register_token_generator("default", BearerTokenGenerator(
            lambda *a, **k: "demo_at_" + secrets.token_urlsafe(24), expires_generator=lambda *a: 300))
        self.server.register_grant(_CodeGrant, [CodeChallenge(required=True), _IdToken(self)])
        self._router = Router(routes=list(self.routes()))

    def routes(self) -> Sequence[BaseRoute]:
        return [Route("/.well-known/openid-configuration", self.discovery, methods=["GET"]),
                Route("/jwks", self.jwks, methods=["GET"]),
                Route("/authorize", self.authorize, methods=["GET", "POST"]),
                Route("/token", self.token, methods=["POST"])]

    def register(self, client_id: str, client_secret: str, redirect_uri: str) -> Client:
        client = self.clients[client_id] = Client(client_id, client_secret, (redirect_uri,))
        return client

    async def discovery(self, request: Request) -> Response:
        return JSONResponse({
            "issuer": self.issuer, "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token", "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"], "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"], "scopes_supported": list(SCOPES),
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"]})

    async def jwks(self, request: Request) -> Response:
        return JSONResponse({"keys": [{**self.key.as_dict(private=False), "kid": self.kid, "use": "sig",
                                       "alg": "RS256"}]})

    async def authorize(self, request: Request) -> Response:
        """GET: the sign-in page (the request validated first); POST: the person chose a user."""
        query = dict(request.query_params)
        form = dict(parse_qsl((await request.body()).decode("latin-1"))) if request.method == "POST" else {}
        read = _Request("GET", str(request.url), request.headers, query, {})
        try:
            grant = self.server.get_consent_grant(read)
        except OAuth2Error as exc:
            return JSONResponse({"error": exc.error, "error_description": exc.description}, 400)
        user = form.get("user", "")
        if request.method == "POST" and user in self.users:
            response: Response = self.server.create_authorization_response(read, grant_user=user, grant=grant)
            return response
        action = html.escape("/authorize?" + urlencode(query))
        buttons = "".join(f'<button name="user" value="{html.escape(u)}">Sign in as {html.escape(u)}</button>'
                          for u in self.users)
        return HTMLResponse(f'<!doctype html><title>Demo provider</title><h1>Demo OpenID provider</h1>'
                            f'<form method="post" action="{action}">{buttons}</form>')

    async def token(self, request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode("latin-1"), keep_blank_values=True))
        read = _Request("POST", str(request.url), request.headers, {}, form)
        response: Response = self.server.create_token_response(read)
        return response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._router(scope, receive, send)
