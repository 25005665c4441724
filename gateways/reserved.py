"""The gateway's own endpoints under ``/.valetkey/`` (no upstream path starts with it).

Everything here is reachable from the sandbox, so it serves only what the sandbox's tools need:

    GET  /.valetkey/healthz    the process is up
    GET  /.valetkey/readyz     secret, egress, JWKS and revocation state all fresh
    GET  /.valetkey/info       what a client needs to use this gateway: the upstream's name and
                               origin (what the gateway stands in for), where the placeholder goes,
                               the sandbox's variable names. No secret, no dialled address, no
                               version, no purposes (a run's grants are in its bundle)
    POST /.valetkey/end-run    the caller's own run ends now, everywhere (send the placeholder as
                               usual); an agent can give up its access, never gain any

Metrics are not served here: they name every run's reasons and volumes across the gateway, so they
go only to the operator listener (``VALETKEY_METRICS_LISTEN``); ``/.valetkey/metrics`` answers
``404 not_found``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from contract.errors import MethodNotAllowed, NotFound, ValetkeyError
from contract.revocation_events import revoke_and_record
from contract.revocations import Scope, new_revocation
from gateways.credentials import extract_placeholder

if TYPE_CHECKING:
    from gateways.exchange import Receive, Send
    from gateways.gateway import Gateway

PREFIX = "/.valetkey/"


async def handle(gw: Gateway, scope: dict[str, Any], receive: Receive, send: Send) -> None:
    path, method = scope["path"][len(PREFIX):], scope["method"]
    try:
        if path == "end-run":
            if method != "POST":
                raise MethodNotAllowed("POST to end your run")
            await _end_run(gw, scope)
            await reply(send, 200, b'{"status":"run ended"}')
        elif method not in ("GET", "HEAD"):
            raise MethodNotAllowed(f"{method} is not served under {PREFIX}")
        elif path == "metrics":
            raise NotFound("metrics are served only on the operator listener (VALETKEY_METRICS_LISTEN)")
        elif path == "healthz":
            await reply(send, 200, b'{"status":"ok"}')
        elif path == "readyz":
            await _readyz(gw, send)
        elif path == "info":
            await reply(send, 200, json.dumps(info(gw)).encode())
        else:
            raise NotFound("unknown reserved path")
    except ValetkeyError as exc:
        headers = [(k.encode(), v.encode()) for k, v in exc.headers.items()]
        await reply(send, exc.status, json.dumps(exc.body()).encode(), extra=headers)


def info(gw: Gateway) -> dict[str, Any]:
    """The upstream's origin stays: the sandbox's tools already know it (the gateway stands in
    for it) and ``valetkey selftest`` proves the sandbox cannot reach it directly."""
    up, injection = gw.upstream, gw.upstream.injection
    return {"upstream": up.name, "base_url": up.base_url,
            "placement": injection.placement.value, "header": injection.header,
            "format": injection.format, "query_param": injection.param,
            "env": {"placeholder": up.env.placeholder, "base_url": up.env.base_url,
                    "base_path": up.env.base_path}}


async def _readyz(gw: Gateway, send: Send) -> None:
    secret = _ok(gw.secrets.current) if gw.credentials is None else True  # a source: per run
    checks = {"secret": secret, "egress": _ok(gw.resolver.current),
              "jwks": gw.keys.fresh, "revocations": gw.revocations.fresh}
    ok = all(checks.values())
    body = {"status": "ready" if ok else "not_ready", "upstream": gw.upstream.name, "checks": checks}
    await reply(send, 200 if ok else 503, json.dumps(body).encode())


async def _end_run(gw: Gateway, scope: dict[str, Any]) -> None:
    headers = list(scope["headers"])
    query = bytes(scope.get("query_string", b""))
    token = extract_placeholder(gw.upstream.injection, headers, query, gw.realm)
    claims = await gw.verifier.verify(token)
    who = f"run:{claims.sub} (itself, through gateway {gw.upstream.name})"
    revocation = new_revocation(Scope.RUN, claims.sub, who, "ended from inside the run",
                                run_expires=claims.exp)
    await revoke_and_record(gw.redis, revocation, gw.settings.audit_maxlen, runtime=claims.client_id)


def _ok(check: Any) -> bool:
    try:
        check()
    except Exception:
        return False
    return True


async def reply(send: Send, status: int, body: bytes, content_type: str = "application/json",
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
