"""The security console: server-rendered pages over the broker's own stores (no API round trip).

    GET  /console                       live runs, pending approvals, alerts, revoke forms (admin)
    GET  /console/approvals             pending approvals the session may decide (admin, approvers)
    GET  /console/approvals/{id}        one approval: the held request, digest, redacted preview
    GET  /console/audit                 the audit stream, live (server-sent events from /console/audit/stream)
    GET  /console/revocations           every revocation with who and why
    GET  /console/login, POST /console/login, POST /console/logout
    POST /console/approvals/{id}/approve|deny, POST /console/revoke   (CSRF token in every form)
    GET  /console/fragments/approvals   the approvals table alone (refreshed by console.js)
    POST /v1/console/sign-in-codes      a one-time sign-in link for the calling admin (valetkey dev)

Sign-in, sessions, CSRF and headers: ``broker/console_auth.py``. Templates: ``broker/templates``;
the one script and stylesheet: ``broker/static`` (no inline script, no build step).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from broker import approvals
from broker.admin import revoke_as, view
from broker.console_auth import (
    LOGIN_COOKIE,
    SESSION_TTL,
    Session,
    Sessions,
    check_csrf,
    check_origin,
    cookie_name,
    read_form,
    set_cookie,
)
from broker.services import Services, authenticate, services
from contract import audit_stream, keys
from contract.errors import BadRequest, Forbidden, NotFound, Reason, Unauthenticated, ValetkeyError
from contract.revocations import Scope

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["when"] = lambda t: time.strftime("%H:%M:%S", time.gmtime(float(t or 0))) + "Z"
ALERTS_STREAM = keys.ALERTS_STREAM
STREAM_FOR = 600.0  # seconds one SSE response lasts; EventSource reconnects by itself
PING_EVERY = 15.0


def _sessions(svc: Services) -> Sessions:
    return Sessions(svc.redis)


def _secure(svc: Services) -> bool:
    return not svc.settings.console_insecure_cookies


async def _session(request: Request) -> Session | None:
    svc = services(request)
    return await _sessions(svc).get(request.cookies.get(cookie_name(_secure(svc)), ""))


def _to_login() -> Response:
    return RedirectResponse("/console/login", status_code=303)


def _page(request: Request, name: str, session: Session | None, **context: Any) -> Response:
    return templates.TemplateResponse(request, name, {"session": session, "done": request.query_params.get(
        "done", "")[:80], **context})


async def _runs(svc: Services) -> list[dict[str, Any]]:
    """Live runs with their request counts (from the recent audit stream) and budget use."""
    records = [r for r in await svc.runs.live(100) if r.state == "active"]
    counts: dict[str, dict[str, int]] = {}
    for entry in await audit_stream.query(svc.redis, audit_stream.Filter(kind="request"), limit=2000):
        line = entry["line"]
        seen = counts.setdefault(str(line.get("run", "")), {"allow": 0, "deny": 0, "error": 0})
        seen[str(line.get("decision", "error"))] = seen.get(str(line.get("decision", "error")), 0) + 1
    out = []
    for record in records:
        used = {}
        for upstream in record.audiences:
            raw = await svc.redis.get(f"{keys.budget(record.run_id, upstream)}:requests")
            limits = svc.policies.upstreams.get(upstream)
            total = limits.run_limits.requests if limits else None
            if total:
                used[upstream] = f"{int(raw or 0)}/{total}"
        out.append({"run": record, "counts": counts.get(record.run_id, {}), "budget": used})
    return out


async def _alerts(svc: Services, limit: int = 20) -> list[dict[str, Any]]:
    try:
        page: Any = await svc.redis.xrevrange(ALERTS_STREAM, count=limit)
    except (RedisError, OSError):
        return []
    out = []
    for _, fields in page:
        try:
            out.append(json.loads(fields.get(b"line") or fields.get(b"alert") or b"{}"))
        except ValueError:
            continue
    return out


async def overview(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return _to_login()
    if not session.is_admin:
        return RedirectResponse("/console/approvals", status_code=303)
    svc = services(request)
    revocations = sorted((await svc.revocations.load()).values(), key=lambda r: r.when, reverse=True)
    return _page(request, "overview.html", session, runs=await _runs(svc),
                 approvals=await approvals.visible(svc, session.caller()), alerts=await _alerts(svc),
                 revocations=[view(r) for r in revocations[:10]], upstreams=sorted(svc.policies.upstreams),
                 runtimes=sorted(svc.policies.runtimes))


async def approvals_page(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return _to_login()
    svc = services(request)
    return _page(request, "approvals.html", session, approvals=await approvals.visible(svc, session.caller()))


async def approvals_fragment(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        raise Unauthenticated("sign in again", Reason.NO_SESSION)
    visible = await approvals.visible(services(request), session.caller())
    return _page(request, "_approvals.html", session, approvals=visible)


async def approval_page(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return _to_login()
    found = await approvals.find(services(request), session.caller(), request.path_params["approval_id"])
    return _page(request, "approval.html", session, a=found)


async def decide(request: Request) -> Response:
    check_origin(request)
    session = await _session(request)
    if session is None:
        raise Unauthenticated("sign in again", Reason.NO_SESSION)
    form = await read_form(request)
    check_csrf(session.csrf, form)
    if request.path_params["verb"] not in ("approve", "deny"):
        raise NotFound("no such action", Reason.NOT_FOUND)
    approve = request.path_params["verb"] == "approve"
    await approvals.decide(services(request), session.caller(), request.path_params["approval_id"], approve,
                           form.get("digest", ""), form.get("reason", ""))
    return RedirectResponse(f"/console/approvals?done={'approved' if approve else 'denied'}", status_code=303)


async def revoke(request: Request) -> Response:
    check_origin(request)
    session = await _session(request)
    if session is None:
        raise Unauthenticated("sign in again", Reason.NO_SESSION)
    form = await read_form(request)
    check_csrf(session.csrf, form)
    session.require_admin()
    scope = next((s for s in Scope if s.value == form.get("scope")), None)
    why = form.get("reason", "").strip()
    if scope is None or not why or (scope is not Scope.ALL and not form.get("name")):
        raise BadRequest("a revocation needs a scope, a name (except for all) and a reason")
    await revoke_as(services(request), session.caller(), scope, form.get("name", "") if scope is not Scope.ALL
                    else "", why)
    return RedirectResponse("/console?done=revoked", status_code=303)


async def revocations_page(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return _to_login()
    session.require_admin()
    loaded = await services(request).revocations.load()
    records = sorted(loaded.values(), key=lambda r: r.when, reverse=True)
    return _page(request, "revocations.html", session, revocations=[view(r) for r in records])


async def audit_page(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return _to_login()
    session.require_admin()
    recent = await audit_stream.query(services(request).redis, audit_stream.Filter(), limit=50)
    return _page(request, "audit.html", session, entries=[_row(e) for e in recent],
                 alerts=await _alerts(services(request), 50))


def _row(entry: dict[str, Any]) -> dict[str, str]:
    """An audit entry as the live table shows it (the same fields the SSE events carry)."""
    line = entry["line"]
    moment = time.strftime("%H:%M:%S", time.gmtime(float(line.get("time", 0)))) + "Z"
    return {"id": entry["id"], "time": moment,
            "kind": entry["kind"], "run": str(line.get("run", "")),
            "what": audit_stream.render(entry).split(" ", 1)[-1][:300]}


async def audit_events(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        raise Unauthenticated("sign in again", Reason.NO_SESSION)
    session.require_admin()
    redis = services(request).redis

    async def events() -> AsyncIterator[bytes]:
        last, ends, pinged = "$", time.monotonic() + STREAM_FOR, time.monotonic()
        while time.monotonic() < ends:
            try:
                answer: Any = await redis.xread({audit_stream.STREAM: last}, block=1000, count=100)
            except (RedisError, OSError):
                yield b"event: unavailable\ndata: {}\n\n"
                await asyncio.sleep(2)
                continue
            for _stream, entries in answer or []:
                for entry_id, fields in entries:
                    last = entry_id.decode()
                    row = _row({"id": last, "kind": fields.get(b"kind", b"request").decode(),
                                "line": json.loads(fields.get(b"line", b"{}"))})
                    yield f"id: {last}\ndata: {json.dumps(row)}\n\n".encode()
            if time.monotonic() - pinged > PING_EVERY:
                pinged = time.monotonic()
                yield b": ping\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})


async def login_page(request: Request) -> Response:
    svc = services(request)
    token = secrets.token_urlsafe(24)
    response = _page(request, "login.html", None, login_csrf=token,
                     code=request.query_params.get("code", "")[:128], oidc=svc.oidc is not None,
                     error=request.query_params.get("error", "")[:80])
    set_cookie(response, LOGIN_COOKIE, token, _secure(svc), 600)
    return response


async def login(request: Request) -> Response:
    check_origin(request)
    svc = services(request)
    form = await read_form(request)
    check_csrf(request.cookies.get(LOGIN_COOKIE, ""), form)
    try:
        if form.get("code"):
            caller = await _sessions(svc).redeem(form["code"])
            if caller is None:
                raise Unauthenticated("this sign-in code is used or expired", Reason.UNKNOWN_CALLER)
        else:
            caller = await svc.callers.authenticate({"x-vault-token": form.get("token", "").strip()})
        caller.require_admin_or_approver()
    except (Unauthenticated, Forbidden) as exc:
        return RedirectResponse(f"/console/login?error={exc.code}", status_code=303)
    raw, session = await _sessions(svc).create(caller)
    response = RedirectResponse("/console" if session.is_admin else "/console/approvals", status_code=303)
    set_cookie(response, cookie_name(_secure(svc)), raw, _secure(svc), SESSION_TTL)
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return response


async def logout(request: Request) -> Response:
    check_origin(request)
    svc = services(request)
    session = await _session(request)
    form = await read_form(request)
    if session is not None:
        check_csrf(session.csrf, form)
        await _sessions(svc).end(request.cookies.get(cookie_name(_secure(svc)), ""))
    response = _to_login()
    response.delete_cookie(cookie_name(_secure(svc)), path="/")
    return response


async def sign_in_code(request: Request) -> Response:
    """A one-time sign-in link for the calling admin's Vault identity (five minutes, single use)."""
    caller = await authenticate(request)
    caller.require_admin()
    code = await _sessions(services(request)).new_code(caller)
    return JSONResponse({"path": f"/console/login?code={code}", "expires_in": 300},
                        headers={"cache-control": "no-store"})


async def on_console_error(request: Request, exc: ValetkeyError) -> Response:
    """A refusal on a console page: the same code, as a small page a person can read."""
    return templates.TemplateResponse(request, "error.html", {"session": None, "error": exc.code,
                                                              "detail": exc.detail}, status_code=exc.status)


ROUTES = [
    Route("/console", overview, methods=["GET"]),
    Route("/console/approvals", approvals_page, methods=["GET"]),
    Route("/console/fragments/approvals", approvals_fragment, methods=["GET"]),
    Route("/console/approvals/{approval_id}", approval_page, methods=["GET"]),
    Route("/console/approvals/{approval_id}/{verb:str}", decide, methods=["POST"]),
    Route("/console/revoke", revoke, methods=["POST"]),
    Route("/console/revocations", revocations_page, methods=["GET"]),
    Route("/console/audit", audit_page, methods=["GET"]),
    Route("/console/audit/stream", audit_events, methods=["GET"]),
    Route("/console/login", login_page, methods=["GET"]),
    Route("/console/login", login, methods=["POST"]),
    Route("/console/logout", logout, methods=["POST"]),
    Route("/v1/console/sign-in-codes", sign_in_code, methods=["POST"]),
    Mount("/console/static", app=StaticFiles(directory=str(HERE / "static")), name="console-static"),
]
