"""The gateway's ASGI application: lifespan, the reserved endpoints, the pipeline for the rest.

Reserved paths under ``/.valetkey/`` (health, readiness, info, end-run) are answered by the
gateway itself; no upstream path starts with ``/.valetkey/``. Metrics are served only on the
operator listener (``VALETKEY_METRICS_LISTEN``), a port the sandbox is not given.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateways import reserved
from gateways.egress import Resolver
from gateways.exchange import Receive, Send, new_exchange
from gateways.gateway import Gateway
from gateways.pipeline import handle
from gateways.settings import GatewaySettings
from policies.model import Alerting, Enterprise, Upstream

RESERVED_PREFIX = "/.valetkey/"
STOP_GRACE = 15.0  # seconds: a stop that takes longer is abandoned, so the process still exits


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
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                gateway: Gateway | None = None
                try:
                    gateway = Gateway.build(self.settings, self.upstream, self.resolver, self.alerting,
                                            self.enterprise)
                    await gateway.start()
                except Exception as exc:  # every start-up failure ends the process with its reason
                    if gateway is not None:
                        await _stop_within(gateway, STOP_GRACE)
                    detail = getattr(exc, "detail", None) or str(exc) or type(exc).__name__
                    self.startup_error = f"{getattr(exc, 'code', 'error')}: {detail}"
                    await send({"type": "lifespan.startup.failed", "message": str(detail)})
                    return
                self.gateway = gateway
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.gateway is not None:
                    await _stop_within(self.gateway, STOP_GRACE)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _reserved(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if self.gateway is not None:
            await reserved.handle(self.gateway, scope, receive, send)


async def _stop_within(gateway: Gateway, grace: float) -> None:
    """Stop, but never wait longer than ``grace``: not even a task that swallows its
    cancellation (``contract/tasks.py``) can keep a failed start-up from ending the process."""
    stopping = asyncio.ensure_future(gateway.stop())
    done, _ = await asyncio.wait({stopping}, timeout=grace)
    if not done:
        logging.getLogger("valetkey.gateway").warning('{"event": "stop_abandoned", "after_s": %g}', grace)
    elif stopping.exception() is not None:
        logging.getLogger("valetkey.gateway").warning('{"event": "stop_failed", "error": "%s"}',
                                                      type(stopping.exception()).__name__)
