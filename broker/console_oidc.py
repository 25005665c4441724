"""The console's OpenID Connect sign-in routes (``broker/oidc_client.py`` does the protocol).

    GET /console/oidc/login      to the provider, with state, nonce and a PKCE challenge; the
                                 state also in a ``SameSite=Lax`` cookie (the provider's redirect
                                 back is a cross-site navigation: a Strict cookie would not come)
    GET /console/oidc/callback   the state must be this browser's; the code is exchanged and the
                                 ID token verified; then the same server-side session as a Vault
                                 token sign-in. The answer is a small page that moves on to the
                                 console by itself: the session cookie is ``SameSite=Strict``, and
                                 a redirect chain begun at the provider would not send it.

A refusal goes back to the sign-in page with its reason code (``?error=``), as the token form does.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from broker.console_auth import SESSION_TTL, Sessions, cookie_name, set_cookie
from broker.oidc_client import STATE_TTL, OIDCClient
from broker.services import services
from contract.errors import BadRequest, Forbidden, NotFound, Reason, Unauthenticated, ValetkeyError

STATE_COOKIE = "valetkey_oidc"
COOKIE_PATH = "/console/oidc"
ONWARD = ('<!doctype html><meta http-equiv="refresh" content="0;url={to}"><title>Signed in</title>'
          '<p>Signed in. <a href="{to}">Continue to the console</a>.</p>')


def _client(request: Request) -> OIDCClient:
    client = services(request).oidc
    if client is None:
        raise NotFound("OIDC sign-in is not configured on this broker")
    return client


def _secure(request: Request) -> bool:
    return not services(request).settings.console_insecure_cookies


async def oidc_login(request: Request) -> Response:
    url, state = await _client(request).begin()
    response = RedirectResponse(url, status_code=303)
    response.set_cookie(STATE_COOKIE, state, max_age=STATE_TTL, path=COOKIE_PATH, secure=_secure(request),
                        httponly=True, samesite="lax")
    return response


async def oidc_callback(request: Request) -> Response:
    client = _client(request)
    state = request.query_params.get("state", "")[:128]
    cookie = request.cookies.get(STATE_COOKIE, "")
    try:
        if request.query_params.get("error"):
            raise Unauthenticated("the provider did not sign you in", Reason.OIDC_TOKEN_INVALID)
        if not state or not hmac.compare_digest(cookie.encode(), state.encode()):
            raise BadRequest("this sign-in was not started in this browser", Reason.OIDC_STATE_INVALID)
        caller = await client.finish(state, request.query_params.get("code", "")[:2048])
    except (BadRequest, Unauthenticated, Forbidden) as exc:
        return _back(request, exc)
    raw, session = await Sessions(services(request).redis).create(caller)
    to = "/console" if session.is_admin else "/console/approvals"
    response = HTMLResponse(ONWARD.format(to=to))
    set_cookie(response, cookie_name(_secure(request)), raw, _secure(request), SESSION_TTL)
    response.delete_cookie(STATE_COOKIE, path=COOKIE_PATH)
    return response


def _back(request: Request, exc: ValetkeyError) -> Response:
    response = RedirectResponse(f"/console/login?error={exc.code}", status_code=303)
    response.delete_cookie(STATE_COOKIE, path=COOKIE_PATH)
    return response


ROUTES = [
    Route("/console/oidc/login", oidc_login, methods=["GET"]),
    Route("/console/oidc/callback", oidc_callback, methods=["GET"]),
]
