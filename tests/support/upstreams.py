"""Real local upstreams for gateway tests: they accept only the real secret and echo what arrived.

``EchoUpstream`` is an ASGI app run under uvicorn (``ThreadedServer``). It records every request
it receives (so tests can assert what the upstream saw) and counts TCP connections (so tests can
assert that a refused request never reached it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from uvicorn.protocols.http.h11_impl import H11Protocol

from tests.support import leaks
from tests.support.asgi import read_body

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Seen:
    method: str
    path: str
    raw_path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name.lower()]


@dataclass
class EchoUpstream:
    """``placement`` is header:<name>:<format> | basic:<user> | query:<param> | open."""

    placement: str
    secret: str
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    sse_gate: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    port: int = 0

    def protocol(self) -> type[H11Protocol]:
        upstream = self

        class Counting(H11Protocol):
            def connection_made(self, transport: Any) -> None:  # type: ignore[override]
                upstream.connections += 1
                super().connection_made(transport)

        return Counting

    def authorized(self, scope: Scope) -> bool:
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope["headers"]}
        kind, _, rest = self.placement.partition(":")
        if kind == "open":  # a destination with no credential (the egress proxy's tests)
            return True
        if kind == "header":
            name, _, fmt = rest.partition(":")
            return headers.get(name) == fmt.replace("{secret}", self.secret)
        if kind == "basic":
            expected = base64.b64encode(f"{rest}:{self.secret}".encode()).decode()
            return headers.get("authorization") == f"Basic {expected}"
        query = dict(parse_qsl(scope["query_string"].decode()))
        return query.get(rest) == self.secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        seen = Seen(scope["method"], scope["path"], scope["raw_path"].decode("latin-1"),
                    scope["query_string"].decode("latin-1"),
                    [(k.decode().lower(), v.decode("latin-1")) for k, v in scope["headers"]], body)
        self.seen.append(seen)
        if not self.authorized(scope):
            await _json(send, 401, {"error": "bad credentials"})
            return
        handler = ROUTES.get(scope["path"].rsplit("/", 1)[-1], _echo)
        await handler(self, scope, seen, send)


async def _json(send: Send, status: int, value: Any, headers: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    body = json.dumps(value).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *headers]})
    await send({"type": "http.response.body", "body": body})


async def _echo(up: EchoUpstream, scope: Scope, seen: Seen, send: Send) -> None:
    await _json(send, 200, {"method": seen.method, "path": seen.path, "query": seen.query,
                            "headers": seen.headers, "body": seen.body.decode("latin-1")})


async def _redirect_home(up: EchoUpstream, scope: Scope, seen: Seen, send: Send) -> None:
    location = f"http://127.0.0.1:{up.port}/v1/items/next?page=2"
    await _json(send, 302, {}, [(b"location", location.encode())])


async def _redirect_away(up: EchoUpstream, scope: Scope, seen: Seen, send: Send) -> None:
    await _json(send, 302, {}, [(b"location", b"https://elsewhere.example/landing?x=1")])


async def _sse(up: EchoUpstream, scope: Scope, seen: Seen, send: Send) -> None:
    """Emit one event, then wait until the test releases the next: a buffering gateway deadlocks."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
    loop = asyncio.get_running_loop()
    for n in range(4):
        # each event ends in "." which no form of a secret starts with: an event whose text ends in
        # what could begin the secret is held until the next one (docs/redaction.md), and this
        # route proves events are otherwise forwarded one by one
        await send({"type": "http.response.body", "body": f"data: event {n}.\n\n".encode(),
                    "more_body": True})
        if n < 3:
            acquired = await loop.run_in_executor(None, up.sse_gate.acquire, True, 10.0)
            if not acquired:
                break
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _slow(up: EchoUpstream, scope: Scope, seen: Seen, send: Send) -> None:
    await asyncio.sleep(3)
    await _json(send, 200, {"slow": True})


LEAK_GATE = threading.Semaphore(0)  # /leak?where=sse: the next event waits for the test's release


async def _leak(up: EchoUpstream, scope: Scope, seen: Seen, send: Send) -> None:
    """Echo the real secret in the form and place the request names (see tests/support/leaks.py):
    ``?form=NAME&where=body|sse|header:NAME&size=BYTES&chunk=BYTES&split=OFFSET&encoding=CODINGS``.
    ``split`` cuts the body inside the form's first occurrence, at that offset, and pauses there.
    ``hostile=NAME`` takes the form from ``leaks.HOSTILE`` instead; ``charset`` re-encodes the whole
    body; ``type`` sets its Content-Type; ``where=sse-split&style=S&parts=N`` streams the form cut
    into N events (``leaks.split_events``)."""
    q = dict(parse_qsl(seen.query))
    form, redacted = (leaks.HOSTILE[q["hostile"]](up.secret), b"") if "hostile" in q else \
        leaks.FORMS[q["form"]](up.secret)
    where = q.get("where", "body")
    content_type = q.get("type", "text/event-stream" if where.startswith("sse") else "application/json")
    headers = [(b"content-type", content_type.encode())]
    body = b'{"ok": true}\n'
    if where.startswith("header:"):
        headers.append((where[7:].encode(), leaks.HEADERS[where[7:]](form)))
    elif where == "body":
        body, _ = leaks.leak_body(form, redacted, int(q.get("size", "0")))
    elif where == "sse-split":
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in leaks.split_events(form, q.get("style", "raw"), int(q.get("parts", "2"))):
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.sleep(0.005)  # each event read on its own
        done = b'{"done": true}\n' if q.get("style") == "ndjson" else b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": done})
        return
    if "charset" in q:  # the whole body as text in a wide encoding (the form given as text)
        body = body.decode("utf-8").encode(q["charset"])
    if "encoding" in q:
        body = leaks.encode(body, q["encoding"])
        headers.append((b"content-encoding", leaks.header_coding(q["encoding"])))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if where == "sse":
        loop = asyncio.get_running_loop()
        for n in range(3):
            event = b'data: {"n": %d, "echo": "%s"}\n\n' % (n, form)
            await send({"type": "http.response.body", "body": event, "more_body": True})
            if not await loop.run_in_executor(None, LEAK_GATE.acquire, True, 10.0):
                break
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        return
    pieces = [body]
    if "split" in q:
        cut = body.index(form) + int(q["split"])
        pieces = [body[:cut], body[cut:]]
    elif int(q.get("chunk", "0")):
        size = int(q["chunk"])
        pieces = [body[i:i + size] for i in range(0, len(body), size)]
    for piece in pieces:
        await send({"type": "http.response.body", "body": piece, "more_body": True})
        if len(pieces) > 1 and len(piece) < 1024:
            await asyncio.sleep(0.005 if len(pieces) == 2 else 0.001)  # each piece read on its own
    await send({"type": "http.response.body", "body": b""})


async def _set_cookie(up: EchoUpstream, scope: Scope, seen: Seen, send: Send) -> None:
    await _json(send, 200, {}, [(b"set-cookie", b"session=run-a-session; Path=/")])


ROUTES: dict[str, Callable[[EchoUpstream, Scope, Seen, Send], Awaitable[None]]] = {
    "set-cookie": _set_cookie,
    "leak": _leak,
    "redirect-home": _redirect_home,
    "redirect-away": _redirect_away,
    "sse": _sse,
    "slow": _slow,
}
