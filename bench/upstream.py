"""A fast local upstream for benchmarks: small JSON GET, 64 KB POST answer, SSE with timestamps.

Run: python -m bench.upstream PORT SECRET [CERT KEY] (with CERT and KEY: TLS, for table 7).
It answers 401 unless ``Authorization: Bearer SECRET`` arrives (so every benchmark run proves the
upstream saw the injected secret).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

SMALL = json.dumps({"id": 1, "name": "widget", "tags": ["a", "b", "c"], "owner": {"login": "acme"},
                    "description": "x" * 96}).encode()
MEDIUM = b"y" * 65536


def make_app(secret: str) -> Any:
    expected = f"Bearer {secret}".encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        authorized = any(k == b"authorization" and v == expected for k, v in scope["headers"])
        if not authorized:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        path = scope["path"]
        if path.endswith("/sse"):
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for n in range(int(dict(p.split("=") for p in scope["query_string"].decode().split("&") if p)
                               .get("n", "20"))):
                await asyncio.sleep(0.02)
                event = f"data: {json.dumps({'n': n, 't': time.time()})}\n\n".encode()
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        body = MEDIUM if scope["method"] == "POST" else SMALL
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def main() -> None:
    import uvicorn

    port, secret = int(sys.argv[1]), sys.argv[2]
    cert, key = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, None)
    uvicorn.run(make_app(secret), host="127.0.0.1", port=port, log_level="warning", access_log=False,
                ssl_certfile=cert, ssl_keyfile=key)


if __name__ == "__main__":
    main()
