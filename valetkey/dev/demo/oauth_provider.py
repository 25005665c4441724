"""A demo OAuth2 provider built on authlib's authorization server: a real token endpoint
(RFC 6749 section 3.2) with the ``client_credentials`` and ``refresh_token`` grants, access tokens
that really expire (``expires_in``), and refresh-token rotation (a refresh spends the refresh
token it was given and answers a new one; the spent one is refused afterwards).

``delegate(client_id, user)`` stands in for a user who authorized the client earlier: it returns a
refresh token for that delegated grant. ``valid(access_token)`` is the resource server's check
(an API behind this provider accepts exactly the live access tokens).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from authlib.oauth2.rfc6749 import AuthorizationServer, ClientMixin, OAuth2Request, grants
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, Router
from starlette.types import Receive, Scope, Send

TOKEN_PATH = "/oauth/token"  # noqa: S105 - an endpoint path
FormRequest = tuple[str, str, Any, dict[str, str]]  # method, URL, headers, form (already read)


@dataclass
class Client(ClientMixin):  # type: ignore[misc]
    client_id: str
    client_secret: str
    scope: str = "read write"
    grant_types: tuple[str, ...] = ("client_credentials", "refresh_token")

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str:
        return ""

    def get_allowed_scope(self, scope: str) -> str:
        allowed = set(self.scope.split())
        return " ".join(s for s in (scope or "").split() if s in allowed)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return False

    def check_client_secret(self, client_secret: str) -> bool:
        return secrets.compare_digest(client_secret.encode(), self.client_secret.encode())

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return False

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in self.grant_types


@dataclass
class Token:
    client_id: str
    user: str
    scope: str
    access_token: str
    refresh_token: str
    expires_at: float
    revoked: bool = False

    # what authlib's refresh grant reads from a stored token
    def get_scope(self) -> str:
        return self.scope

    def get_client_id(self) -> str:
        return self.client_id

    def check_client(self, client: Client) -> bool:
        return client.client_id == self.client_id

    def is_expired(self) -> bool:
        return False  # a refresh token does not expire here; it is spent by rotation

    def is_revoked(self) -> bool:
        return self.revoked


class _RotatingRefresh(grants.RefreshTokenGrant):  # type: ignore[misc]
    INCLUDE_NEW_REFRESH_TOKEN = True  # rotation: every refresh answers a new refresh token
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]  # noqa: RUF012

    def authenticate_refresh_token(self, refresh_token: str) -> Token | None:
        provider: OAuthProvider = self.server.provider
        token = provider.refresh_tokens.get(refresh_token)
        return None if token is None or token.revoked else token

    def authenticate_user(self, refresh_token: Token) -> str:
        return refresh_token.user

    def revoke_old_credential(self, refresh_token: Token) -> None:
        refresh_token.revoked = True


class _FormRequest(OAuth2Request):  # type: ignore[misc]
    """A token request whose form body was already read (the ASGI side is async, authlib is not)."""

    def __init__(self, method: str, uri: str, headers: Any, form: dict[str, str]) -> None:
        super().__init__(method, uri, headers=headers)
        self.payload = BasicOAuth2Payload(form)
        self._form = form

    @property
    def form(self) -> dict[str, str]:
        return self._form

    @property
    def args(self) -> dict[str, str]:
        return {}


class _Server(AuthorizationServer):  # type: ignore[misc]
    def __init__(self, provider: OAuthProvider) -> None:
        super().__init__(scopes_supported=["read", "write"])
        self.provider = provider

    def query_client(self, client_id: str) -> Client | None:
        return self.provider.clients.get(client_id)

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        self.provider.save(token, request)

    def create_oauth2_request(self, request: FormRequest) -> OAuth2Request:
        method, uri, headers, form = request
        return _FormRequest(method, uri, headers, form)

    def handle_response(self, status: int, body: Any, headers: Any) -> Response:
        return JSONResponse(body, status, dict(headers))

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class OAuthProvider:
    """``expires_in``: access token lifetime in seconds (short in tests, to see refreshes)."""

    expires_in: int = 3600
    clock: Callable[[], float] = time.time
    clients: dict[str, Client] = field(default_factory=dict)
    access_tokens: dict[str, Token] = field(default_factory=dict)
    refresh_tokens: dict[str, Token] = field(default_factory=dict)
    issued: int = 0
    rotations: int = 0

    def __post_init__(self) -> None:
        self.server = _Server(self)
        generator = BearerTokenGenerator(lambda *a, **k: "demo_at_" + secrets.token_urlsafe(24),
                                         lambda *a, **k: "demo_rt_" + secrets.token_urlsafe(24),
                                         expires_generator=lambda client, grant_type: self.expires_in)
        self.server.register_token_generator("default", generator)
        self.server.register_grant(grants.ClientCredentialsGrant)
        self.server.register_grant(_RotatingRefresh)
        self._router = Router(routes=list(self.routes()))

    def routes(self) -> Sequence[BaseRoute]:
        return [Route(TOKEN_PATH, self.token, methods=["POST"])]

    def register(self, client_id: str, client_secret: str) -> Client:
        client = self.clients[client_id] = Client(client_id, client_secret)
        return client

    def delegate(self, client_id: str, user: str, scope: str = "read") -> str:
        """A refresh token for ``user``'s earlier authorization of ``client_id``."""
        value = "demo_rt_" + secrets.token_urlsafe(24)
        self.refresh_tokens[value] = Token(client_id, user, scope, "", value, 0.0)
        return value

    def save(self, token: dict[str, Any], request: OAuth2Request) -> None:
        user = request.user if isinstance(request.user, str) else ""
        stored = Token(request.client.client_id, user, token.get("scope", ""), token["access_token"],
                       token.get("refresh_token", ""), self.clock() + int(token["expires_in"]))
        self.access_tokens[stored.access_token] = stored
        if stored.refresh_token:
            self.refresh_tokens[stored.refresh_token] = stored
            self.rotations += request.payload.grant_type == "refresh_token"
        self.issued += 1

    def valid(self, access_token: str | None) -> bool:
        token = self.access_tokens.get(access_token or "")
        return token is not None and token.expires_at > self.clock()

    async def token(self, request: Request) -> Response:
        body = (await request.body()).decode("latin-1")
        form = dict(parse_qsl(body, keep_blank_values=True))
        read: FormRequest = (request.method, str(request.url), request.headers, form)
        response: Response = self.server.create_token_response(read)
        return response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._router(scope, receive, send)
