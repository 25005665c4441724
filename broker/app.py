"""The broker's Starlette application: authenticate the runtime, check policy, mint, register.

Routes
    POST   /v1/runs                 mint a run bundle (runtime callers)
    GET    /v1/runs/{run_id}        the run record (its runtime, or the security team)
    DELETE /v1/runs/{run_id}        end the run: its tokens stop verifying
    GET    /.well-known/jwks.json   every live transit key version
    GET    /openapi.json, /healthz, /readyz
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from broker import bundle
from broker.admin import ROUTES as ADMIN_ROUTES
from broker.admin import end_run_artifacts
from broker.admission import Admission
from broker.approvals import ROUTES as APPROVAL_ROUTES
from broker.bodies import read_json_object
from broker.callers import Caller
from broker.console import ROUTES as CONSOLE_ROUTES
from broker.console import on_console_error
from broker.console_auth import ConsoleHeaders
from broker.console_oidc import ROUTES as OIDC_ROUTES
from broker.grants import parse_run_request
from broker.openapi import OPENAPI
from broker.reaper import Reaper
from broker.run_tokens import run_claims
from broker.runs import RunRecord, describe, new_run_id
from broker.services import Services, authenticate, event, services
from broker.settings import BrokerSettings
from contract import audit_stream
from contract.errors import Forbidden, NotFound, Reason, ValetkeyError, render
from contract.jwks import jwks_from_transit
from policies.model import PolicySet

log = logging.getLogger("valetkey.broker")


async def create_run(request: Request) -> Response:
    svc = services(request)
    caller = await authenticate(request)
    runtime = caller.require_runtime()
    run_request = parse_run_request(await read_json_object(request), runtime, svc.policies,
                                    svc.settings.default_ttl, proxy=svc.settings.proxy.enabled)
    block = await svc.revocations.blocking(runtime.name, run_request.by_upstream)
    if block is not None:
        raise Forbidden(f"minting is revoked ({block.key}): {block.why}", Reason.REVOKED)
    # from memory (refreshed in the background); refused before anything is signed or stored
    ca_pem = svc.proxy_trust.bundle_pem() if svc.proxy_trust is not None else None
    run_id, now = new_run_id(), int(time.time())
    claims = run_claims(request=run_request, policies=svc.policies, proxy=svc.settings.proxy,
                        issuer=svc.settings.issuer, run_id=run_id, runtime=runtime.name, now=now,
                        key_name=svc.settings.signing_key)
    tokens = dict(zip(claims.audiences, await svc.signer.sign(claims.all()), strict=True))
    record = RunRecord(
        run_id=run_id, runtime=runtime.name, grants=run_request.grant_list(), created=now,
        expires=now + run_request.ttl, audiences=claims.audiences,
    )
    await svc.runs.create(record)
    event("run_created", run=run_id, runtime=runtime.name, grants=record.grants,
          expires=record.expires, jtis=[c.jti for c in claims.all()])
    await audit_stream.append(svc.redis, {"event": "run_created", "run": run_id, "runtime": runtime.name,
                                      "grants": record.grants, "expires": record.expires, "time": now},
                          kind="run", maxlen=svc.settings.audit_maxlen)
    proxy_token = tokens.pop(svc.settings.proxy.audience) if claims.proxy is not None else None
    body = bundle.render(record, tokens, svc.policies, svc.settings,
                         bundle.ProxyPart(proxy_token, ca_pem) if proxy_token and ca_pem else None)
    return JSONResponse(body, status_code=201, headers={"Cache-Control": "no-store"})


async def _owned_run(request: Request) -> tuple[Caller, RunRecord]:
    svc = services(request)
    caller = await authenticate(request)
    record = await svc.runs.get(request.path_params["run_id"])
    if record is None or not (caller.is_admin or record.runtime == caller.name):
        raise NotFound("no such run")  # never reveal another runtime's runs
    return caller, record


async def get_run(request: Request) -> Response:
    _, record = await _owned_run(request)
    svc = services(request)
    return JSONResponse(await describe(record, svc.revocations, time.time()))


async def end_run(request: Request) -> Response:
    caller, record = await _owned_run(request)
    svc = services(request)
    if record.state != "ended":  # a repeated DELETE changes nothing and logs nothing
        # revoke first: if this fails the run stays active and the DELETE can be retried
        await end_run_artifacts(svc, record, caller.name, "run ended")
        event("run_ended", run=record.run_id, runtime=record.runtime, by=caller.name)
    ended = await svc.runs.end(record.run_id, caller.name)
    return JSONResponse(ended.to_json())


async def jwks(request: Request) -> Response:
    key = await services(request).signer.key()
    return JSONResponse(jwks_from_transit(key), headers={"Cache-Control": "max-age=60"})


async def openapi(request: Request) -> Response:
    return JSONResponse(OPENAPI)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    svc = services(request)
    checks = {"vault": await svc.vault.healthy(), "vault_token": await svc.vault.token_valid(),
              "redis": await svc.runs.ping()}
    if svc.proxy_trust is not None:  # no mint can succeed before the proxy CA has been read
        checks["proxy_ca"] = svc.proxy_trust.ready
    ok = all(checks.values())
    body: dict[str, Any] = {"status": "ready" if ok else "not_ready", "checks": checks}
    if not ok:
        body["error"] = "not_ready"
    return JSONResponse(body, status_code=200 if ok else 503)


async def on_valetkey_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ValetkeyError):  # pragma: no cover - registered for this family only
        raise exc
    event("refused", path=request.url.path, method=request.method, error=exc.code,
          status=exc.status)
    if request.url.path.startswith("/console") and not request.url.path.startswith("/console/audit/stream"):
        return await on_console_error(request, exc)
    return error_response(exc)


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (a path's methods may be split over routes)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return ", ".join(sorted(methods))


async def on_http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    code = {404: Reason.NOT_FOUND, 405: Reason.METHOD_NOT_ALLOWED}.get(status, Reason.INVALID_REQUEST)
    refusal = ValetkeyError(f"HTTP {status}", code)
    if status == 405:
        refusal.headers["Allow"] = allowed_methods(request)  # RFC 9110 15.5.6
    return error_response(refusal, status)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return error_response(ValetkeyError("internal error", Reason.INTERNAL_ERROR))


def error_response(exc: ValetkeyError, status: int | None = None) -> Response:
    """Every refusal the broker sends, rendered by the one renderer gateways use too."""
    status, headers, body = render(exc, status=status)
    return Response(body, status_code=status, headers={k.decode(): v.decode() for k, v in headers})


def create_app(settings: BrokerSettings, policies: PolicySet | None = None) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        svc = Services.build(settings, policies)
        app.state.services = svc
        await svc.keeper.start()  # the revocations are back in Redis before the first mint
        reaper = Reaper(svc)
        await reaper.start()
        if svc.proxy_trust is not None:
            await svc.proxy_trust.start()
        try:
            yield
        finally:
            if svc.proxy_trust is not None:
                await svc.proxy_trust.stop()
            await reaper.stop()
            await svc.keeper.stop()
            await svc.aclose()

    routes = [
        *ADMIN_ROUTES,
        *APPROVAL_ROUTES,
        *CONSOLE_ROUTES,
        *OIDC_ROUTES,
        Route("/v1/runs", create_run, methods=["POST"]),
        Route("/v1/runs/{run_id}", get_run, methods=["GET"]),
        Route("/v1/runs/{run_id}", end_run, methods=["DELETE"]),
        Route("/.well-known/jwks.json", jwks, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    admission = Middleware(Admission, concurrency=settings.mint_concurrency, queue=settings.mint_queue,
                           wait=float(settings.mint_queue_wait))
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(ConsoleHeaders), admission],
        exception_handlers={
            ValetkeyError: on_valetkey_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
    )
