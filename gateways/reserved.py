"""The gateway's own endpoints under ``/.valetkey/`` (no upstream path starts with it).

    GET  /.valetkey/healthz    the process is up
    GET  /.valetkey/readyz     secret, egress, JWKS and revocation state all fresh
    GET  /.valetkey/metrics    Prometheus
    GET  /.valetkey/info       which upstream this is and where its placeholder goes (no secret)
    POST /.valetkey/end-run    the caller's own run ends now, everywhere (send the placeholder as
                               usual); an agent can give up its access, never gain any
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker import auditlog
from broker.errors import MethodNotAllowed, NotFound, ValetkeyError
from broker.revocations import RevocationStore, Scope, new_revocation
from gateways.credentials import extract_placeholder

if TYPE_CHECKING:
    from gateways.app import Gateway
    from gateways.pipeline import Receive, Send

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
            await reply(send, 200, generate_latest(gw.metrics.registry), CONTENT_TYPE_LATEST)
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
    up, injection = gw.upstream, gw.upstream.injection
    return {"upstream": up.name, "audience": up.name, "base_url": up.base_url,
            "placement": injection.placement.value, "header": injection.header,
            "format": injection.format, "query_param": injection.param,
            "env": {"placeholder": up.env.placeholder, "base_url": up.env.base_url,
                    "base_path": up.env.base_path},
            "purposes": {
                name: {"why": p.why, "methods": sorted(p.methods), "paths": [str(t) for t in p.paths]}
                for name, p in up.purposes.items()
            }}


async def _readyz(gw: Gateway, send: Send) -> None:
    checks = {"secret": _ok(gw.secrets.current), "egress": _ok(gw.resolver.current),
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
    record = await RevocationStore(gw.redis).revoke(
        new_revocation(Scope.RUN, claims.sub, who, "ended from inside the run", run_expires=claims.exp))
    await auditlog.append(gw.redis, {"event": "revoke", "scope": "run", "name": claims.sub, "run": claims.sub,
                                     "runtime": claims.client_id, "who": who, "why": record.why,
                                     "time": record.when}, kind="revocation",
                          maxlen=gw.settings.audit_maxlen)


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
