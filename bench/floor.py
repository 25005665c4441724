"""The Python floor for table 1: the least a Python proxy built like the gateway can do.

Run: python -m bench.floor PORT UPSTREAM_PORT SECRET. The same server as the gateway (uvicorn,
``gateways.server.GatewayProtocol``) and the same upstream client (``gateways.upstream``, for the
bench policy's upstream), forwarding every request with ``Authorization: Bearer SECRET`` and
nothing else: no token, no policy check, no scan, no budget, no redaction, no audit. Like the
bare Ed25519 check under token verification, it bounds what any gateway of this design can reach
on the machine; the gateway's distance from it is the cost of its checks.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import uvicorn

from bench.stack import POLICY, UPSTREAM
from gateways.credentials import HOP_BY_HOP
from gateways.server import GatewayProtocol
from gateways.upstream import UpstreamClient
from policies.load import load_policy_dir

DROPPED = HOP_BY_HOP | {b"host", b"authorization", b"content-length"}


def make_app(upstream_port: int, secret: str) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bench.yaml").write_text(POLICY.format(port=upstream_port))
        upstream = load_policy_dir(tmp).upstreams[UPSTREAM]
    client: UpstreamClient | None = None
    injected = (b"authorization", b"Bearer " + secret.encode())

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal client
        if scope["type"] != "http":
            return
        if client is None:
            client = UpstreamClient(upstream, connect=5.0, read=30.0)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        headers = [(k, v) for k, v in scope["headers"] if k not in DROPPED] + [injected]
        response = await client.open(scope["method"], "127.0.0.1", target, headers, body)
        try:
            out = [(k.lower(), v) for k, v in response.headers if k.lower() not in DROPPED]
            await send({"type": "http.response.start", "status": response.status, "headers": out})
            async for chunk in response.iter_body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    return app


def main() -> None:
    port, upstream_port, secret = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    uvicorn.run(make_app(upstream_port, secret), host="127.0.0.1", port=port, http=GatewayProtocol,
                loop="asyncio", log_level="warning", access_log=False, server_header=False,
                date_header=False, lifespan="off", proxy_headers=False)


if __name__ == "__main__":
    main()
