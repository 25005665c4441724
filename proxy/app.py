"""The proxy's ASGI application and how it is served.

Requests reach ``ProxyApp`` two ways: from inside a terminated tunnel (the scope carries the
tunnel's ``Admission``), or as plain-http proxy requests with an absolute-form target
(``GET http://host/path``, ``Proxy-Authorization`` on each), admitted here the way a CONNECT is.
Either way the request runs ``gateways.pipeline.handle`` with the proxy's step lists, against
the gateway of the host it is for, and writes one audit line.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

import uvicorn

from contract.errors import BadRequest, Decision, Reason, ValetkeyError, render
from gateways import lifespan
from gateways.audit import AuditRecord
from gateways.exchange import Receive, Send, new_exchange
from gateways.pipeline import handle
from gateways.reserved import reply
from gateways.server import config as gateway_config
from policies.model import PolicySet
from proxy.connect import TUNNEL_KEY, Admission, admit, proxy_status
from proxy.hub import Hub
from proxy.protocol import HUB_KEY, ProxyProtocol
from proxy.settings import ProxySettings
from proxy.steps import DESTINATION_STEPS, UNLISTED_STEPS, UPSTREAM_STEPS

log = logging.getLogger("valetkey.proxy")
RESERVED_PREFIX = "/.valetkey/"


class ProxyApp:
    def __init__(self, settings: ProxySettings, policies: PolicySet) -> None:
        self.settings = settings
        self.policies = policies
        self.hub: Hub | None = None
        self.startup_error = ""

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http" or self.hub is None:
            return
        admission = scope.get(TUNNEL_KEY)
        if admission is None and str(scope.get("path", "")).startswith(RESERVED_PREFIX):
            await self._reserved(self.hub, scope, send)  # the proxy's own probes, origin-form
            return
        if not isinstance(admission, Admission):
            admission = await self._admit_plain(self.hub, scope, receive, send)
            if admission is None:
                return
        route = admission.route
        steps = (UPSTREAM_STEPS if route.upstream is not None else
                 UNLISTED_STEPS if route.unlisted is not None else DESTINATION_STEPS)
        ex = new_exchange(scope, receive, send, admission.route.name)
        # the tunnel's run is known from its CONNECT: every decision inside is audited with it
        ex.record.run, ex.record.runtime = admission.claims.sub, admission.claims.client_id
        await handle(admission.gateway, ex, steps)

    async def _reserved(self, hub: Hub, scope: dict[str, Any], send: Send) -> None:
        """``GET /.valetkey/healthz`` (the process is up) and ``/.valetkey/readyz`` (CA loaded,
        every upstream secret and address current, JWKS and revocation state fresh): the probes of
        an orchestrator, on the proxy's own listener. Nothing else is served here."""
        path = scope["path"][len(RESERVED_PREFIX):]
        if scope["method"] not in ("GET", "HEAD") or path not in ("healthz", "readyz"):
            await reply(send, 404, b'{"error":"not_found","detail":"only healthz and readyz here"}')
            return
        if path == "healthz":
            await reply(send, 200, b'{"status":"ok"}')
            return
        checks = hub.readiness()
        ok = all(checks.values())
        body = {"status": "ready" if ok else "not_ready", "checks": checks}
        await reply(send, 200 if ok else 503, json.dumps(body).encode())

    async def _admit_plain(self, hub: Hub, scope: dict[str, Any], receive: Receive,
                           send: Send) -> Admission | None:
        """A plain-http proxy request: ``http://host[:port]/path``, admitted like a CONNECT; the
        scope is rewritten to the origin-form target the pipeline expects."""
        raw = bytes(scope.get("raw_path") or b"")
        record = AuditRecord(request_id=os.urandom(16).hex(), upstream="-", method=str(scope["method"])[:16],
                             path="[absolute-form target]")
        ex = new_exchange(scope, receive, send, "-")
        ex.record = record
        started = time.perf_counter()
        try:
            url = urlsplit(raw.decode("latin-1") + ("?" + scope["query_string"].decode("latin-1")
                                                     if scope.get("query_string") else ""))
            if url.scheme != "http" or not url.hostname:
                raise BadRequest("a proxy request names an http:// URL (https goes through CONNECT)",
                                 Reason.ABSOLUTE_FORM_TARGET)
            if url.username is not None or url.password is not None:
                raise BadRequest("credentials in the URL are never forwarded", Reason.CREDENTIAL_PASSTHROUGH)
            port = url.port or 80
            admission = await admit(hub, url.hostname, port, list(scope["headers"]), record)
        except ValueError:
            error: ValetkeyError = BadRequest("the proxy request target is not a URL", Reason.INVALID_REQUEST)
        except ValetkeyError as exc:
            error = exc
        else:
            path = url.path or "/"
            scope["raw_path"] = path.encode("latin-1")
            scope["path"] = path
            scope["query_string"] = url.query.encode("latin-1")
            scope[TUNNEL_KEY] = admission
            return admission
        record.decision, record.reason = Decision.of(error), error.code
        status, headers, body = render(error, status=proxy_status(error), request_id=record.request_id)
        record.status = status
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        record.duration_ms = round((time.perf_counter() - started) * 1000, 3)
        hub.base.audit.write(record)
        return None

    async def _lifespan(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        def started(hub: Hub) -> None:
            self.hub = hub
            # the server's lifespan state: where each connection's ProxyProtocol finds the hub
            scope["state"][HUB_KEY] = hub

        await lifespan.run(receive, send, lambda: Hub(self.settings, self.policies), ready=started,
                           failed=self._failed, log=log)

    def _failed(self, error: str) -> None:
        self.startup_error = error


def config(app: ProxyApp | str, settings: ProxySettings, log_level: str = "warning",
           workers: int = 1) -> uvicorn.Config:
    cfg = gateway_config(app, settings.gateway, log_level=log_level, workers=workers)
    cfg.http = ProxyProtocol
    return cfg


def from_env() -> ProxyApp:
    """App factory for uvicorn workers."""
    from policies.load import load_policy_dir

    settings = ProxySettings.from_env()
    return ProxyApp(settings, load_policy_dir(settings.gateway.policy_dir))
