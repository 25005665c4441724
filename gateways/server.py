"""Serving a gateway: uvicorn with one change — malformed HTTP gets our JSON error shape."""

from __future__ import annotations

import json
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from broker.errors import Reason


class JsonErrorH11Protocol(H11Protocol):
    """Requests h11 refuses (duplicate Host, conflicting Content-Length, bad syntax) are answered
    ``400 {"error": "malformed_request"}`` like every other refusal, and the connection closed."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": Reason.MALFORMED_REQUEST.value, "detail": msg}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


def config(app: Any, host: str, port: int, log_level: str = "warning", workers: int = 1) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=host, port=port, http=JsonErrorH11Protocol, log_level=log_level, access_log=False,
        server_header=False, date_header=False, lifespan="on", workers=workers,
        h11_max_incomplete_event_size=64 * 1024,
    )


def from_env() -> Any:
    """App factory for uvicorn workers: upstream from ``VALETKEY_GATEWAY_UPSTREAM``."""
    import os

    from gateways.app import GatewayApp
    from gateways.settings import GatewaySettings
    from policies.load import load_policy_dir

    name = os.environ["VALETKEY_GATEWAY_UPSTREAM"]
    settings = GatewaySettings.from_env(name)
    policies = load_policy_dir(settings.policy_dir)
    return GatewayApp(settings, policies.upstreams[name], alerting=policies.alerting)
