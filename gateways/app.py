"""The gateway's ASGI application: lifespan, the reserved endpoints, the pipeline for the rest.

Reserved paths under ``/.valetkey/`` (health, readiness, info, end-run) are answered by the
gateway itself; no upstream path starts with ``/.valetkey/``. Metrics are served only on the
operator listener (``VALETKEY_METRICS_LISTEN``), a port the sandbox is not given.
"""

from __future__ import annotations

import logging
from typing import Any

from gateways import lifespan, reserved
from gateways.egress import Resolver
from gateways.exchange import Receive, Send, new_exchange
from gateways.gateway import Gateway
from gateways.pipeline import handle
from gateways.settings import GatewaySettings
from policies.model import Alerting, Enterprise, Upstream

RESERVED_PREFIX = "/.valetkey/"


class GatewayApp:
    """The ASGI callable: lifespan, reserved endpoints, and the pipeline for everything else."""

    def __init__(self, settings: GatewaySettings, upstream: Upstream, resolver: Resolver | None = None,
                 alerting: Alerting | None = None, enterprise: Enterprise | None = None) -> None:
        self.settings = settings
        self.upstream = upstream
        self.alerting = alerting
        self.enterprise = enterprise
        self.resolver = resolver  # a DNS seam for tests; production uses the system resolver
        self.startup_error: str = ""
        self.gateway: Gateway | None = None

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http" or self.gateway is None:
            return
        if str(scope.get("path", "")).startswith(RESERVED_PREFIX):
            await self._reserved(scope, receive, send)
            return
        await handle(self.gateway, new_exchange(scope, receive, send, self.upstream.name))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await lifespan.run(receive, send, self._build, ready=self._started, failed=self._failed,
                           log=logging.getLogger("valetkey.gateway"))

    def _build(self) -> Gateway:
        return Gateway.build(self.settings, self.upstream, self.resolver, self.alerting, self.enterprise)

    def _started(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def _failed(self, error: str) -> None:
        self.startup_error = error

    async def _reserved(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if self.gateway is not None:
            await reserved.handle(self.gateway, scope, receive, send)

