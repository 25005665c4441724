"""The security console's sign-in, sessions, CSRF and response headers.

* Sign-in exchanges a Vault token carrying the admin policy (or an approver group's policy) for a
  server-side session: the token is looked up once through the broker's caller check and never
  kept, in the browser or here. A session lives in Redis (``valetkey:console:session:<sha256 of
  its id>``, so a Redis reader cannot take one over) for ``SESSION_TTL`` seconds from sign-in, and
  any broker replica serves it. A one-time sign-in code (``POST /v1/console/sign-in-codes``, what
  ``valetkey dev`` prints) is the same exchange done ahead: single-use, five minutes.
* The cookie is ``HttpOnly`` and ``SameSite=Strict``, and ``Secure`` with the ``__Host-`` prefix
  unless ``VALETKEY_CONSOLE_INSECURE_COOKIES`` is set (plain-HTTP dev only).
* Every form carries the session's CSRF token (compared with ``hmac.compare_digest``); the sign-in
  form carries a login token matched against a cookie of its own. A POST whose ``Origin`` or
  ``Sec-Fetch-Site`` says another site is refused as well (``403 csrf_failed``).
* Every console response carries a strict Content-Security-Policy (scripts and styles from the
  console's own static files only: no inline script), no-store, no framing, and referrers only
  within the console (``no-referrer`` would make Chromium send ``Origin: null`` on its own forms).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.callers import Caller
from contract import keys
from contract.errors import BadRequest, Forbidden, PayloadTooLarge, Reason, Unavailable

SESSION_PREFIX = keys.CONSOLE_SESSION_PREFIX
CODE_PREFIX = keys.CONSOLE_CODE_PREFIX
OIDC_STATE_PREFIX = keys.CONSOLE_OIDC_STATE_PREFIX  # an OIDC sign-in under way (broker/oidc_client.py)
SESSION_TTL = 30 * 60
CODE_TTL = 5 * 60
MAX_FORM = 16 * 1024
LOGIN_COOKIE = "valetkey_login"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"content-security-policy": CSP, "x-frame-options": "DENY", "x-content-type-options": "nosniff",
           "referrer-policy": "same-origin", "cache-control": "no-store",
           "cross-origin-opener-policy": "same-origin"}


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    who: str
    is_admin: bool
    groups: frozenset[str]
    csrf: str
    expires: float

    def caller(self) -> Caller:
        return Caller(name=self.who, runtime=None, is_admin=self.is_admin, groups=self.groups)

    def require_admin(self) -> None:
        if not self.is_admin:
            raise Forbidden("this page is the security team's; approvers see their approvals only",
                            Reason.NOT_ADMIN)


async def redis_call(call: Any, what: str) -> Any:
    """A console store's Redis call, its failure a refusal (``redis_unavailable``)."""
    try:
        return await call
    except (RedisError, OSError) as exc:
        raise Unavailable(f"{what} unavailable: {type(exc).__name__}", Reason.REDIS_UNAVAILABLE) from None


class Sessions:
    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client

    async def _call(self, call: Any) -> Any:
        return await redis_call(call, "console sessions")

    async def create(self, caller: Caller) -> tuple[str, Session]:
        raw = secrets.token_urlsafe(32)
        session = Session(who=caller.name, is_admin=caller.is_admin, groups=caller.groups,
                          csrf=secrets.token_urlsafe(32), expires=time.time() + SESSION_TTL)
        value = json.dumps({"who": session.who, "is_admin": session.is_admin,
                            "groups": sorted(session.groups), "csrf": session.csrf,
                            "expires": session.expires})
        await self._call(self._redis.set(SESSION_PREFIX + _hash(raw), value, ex=SESSION_TTL))
        return raw, session

    async def get(self, raw: str) -> Session | None:
        if not raw or len(raw) > 128:
            return None
        value = await self._call(self._redis.get(SESSION_PREFIX + _hash(raw)))
        if value is None:
            return None
        data = json.loads(value)
        if data["expires"] < time.time():
            return None
        return Session(who=data["who"], is_admin=data["is_admin"], groups=frozenset(data["groups"]),
                       csrf=data["csrf"], expires=data["expires"])

    async def end(self, raw: str) -> None:
        if raw and len(raw) <= 128:
            await self._call(self._redis.delete(SESSION_PREFIX + _hash(raw)))

    async def new_code(self, caller: Caller) -> str:
        """A one-time sign-in code for ``caller`` (who made it is who signs in)."""
        code = secrets.token_urlsafe(24)
        value = json.dumps({"who": caller.name, "is_admin": caller.is_admin, "groups": sorted(caller.groups)})
        await self._call(self._redis.set(CODE_PREFIX + _hash(code), value, ex=CODE_TTL))
        return code

    async def redeem(self, code: str) -> Caller | None:
        if not code or len(code) > 128:
            return None
        value = await self._call(self._redis.getdel(CODE_PREFIX + _hash(code)))
        if value is None:
            return None
        data = json.loads(value)
        return Caller(name=data["who"], runtime=None, is_admin=data["is_admin"],
                      groups=frozenset(data["groups"]))


def cookie_name(secure: bool) -> str:
    return "__Host-valetkey_session" if secure else "valetkey_session"


def set_cookie(response: Response, name: str, value: str, secure: bool, max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path="/", secure=secure, httponly=True,
                        samesite="strict")


async def read_form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body, bounded; one value per name."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        raise BadRequest("expected a form (application/x-www-form-urlencoded)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise PayloadTooLarge(f"form larger than {MAX_FORM} bytes")
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("malformed form") from None
    form: dict[str, str] = {}
    for key, value in pairs:
        if key in form:
            raise BadRequest(f"form field {key!r} given twice")
        form[key] = value
    return form


def check_origin(request: Request) -> None:
    """A cross-site POST is refused before its form is looked at."""
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.url.netloc}"
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none") or (
            origin is not None and origin != own):
        raise Forbidden("cross-site form post refused", Reason.CSRF_FAILED)


def check_csrf(expected: str, form: dict[str, str]) -> None:
    given = form.get("csrf", "")
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again", Reason.CSRF_FAILED)


class ConsoleHeaders:
    """Adds the console's security headers to every response under ``/console``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/console"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k.encode(), v.encode()) for k, v in HEADERS.items() if k.encode() not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
