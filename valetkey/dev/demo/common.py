"""What every demo upstream shares: a record of what arrived, a constant-time secret check, and
the ASGI wrapper that records each request and answers 401 unless it carries the real secret.

A demo upstream behaves like the real API only as far as a client can tell: the response shapes,
the authentication scheme and the error bodies. It holds state in memory and forgets it on exit.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Router
from starlette.types import Message, Receive, Scope, Send

MAX_BODY = 64 * 1024 * 1024  # a demo server buffers request bodies; beyond this it answers 413


@dataclass(frozen=True)
class Seen:
    """One request as the upstream received it (header names lower-case)."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name.lower()]


def same_secret(given: str | None, secret: str) -> bool:
    """``given`` is exactly ``secret`` (compared in constant time; an empty secret never matches)."""
    if given is None or not secret:
        return False
    return hmac.compare_digest(given.encode(), secret.encode())


def bearer_token(headers: Headers, schemes: tuple[str, ...] = ("bearer",)) -> str | None:
    """The token of ``Authorization: <scheme> <token>`` for one of ``schemes`` (case-insensitive)."""
    values = headers.getlist("authorization")
    if len(values) != 1:
        return None
    scheme, _, token = values[0].strip().partition(" ")
    return token.strip() if scheme.lower() in schemes and token.strip() else None


def basic_credentials(headers: Headers) -> tuple[str, str] | None:
    """``(username, password)`` of ``Authorization: Basic ...``, or None."""
    token = bearer_token(headers, ("basic",))
    if token is None:
        return None
    try:
        user, sep, password = base64.b64decode(token, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return (user, password) if sep else None


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(value), status, headers, media_type="application/json")


def sse_event(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; ``data`` is JSON-encoded unless it is already a string."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


@dataclass
class DemoUpstream:
    """Base ASGI app: record the request, refuse it unless ``authorized``, then route it.

    Subclasses set ``routes`` and implement ``authorized`` and ``unauthorized``.
    """

    secret: str
    seen: list[Seen] = field(default_factory=list, init=False)

    def routes(self) -> Sequence[BaseRoute]:
        raise NotImplementedError

    def authorized(self, headers: Headers) -> bool:
        raise NotImplementedError

    def unauthorized(self, request: Request) -> Response:
        raise NotImplementedError

    def refusal(self, request: Request) -> Response | None:
        """None to route the request, else the answer; by default ``unauthorized`` unless the
        headers are ``authorized``. Subclasses that decide by path (GitHub App tokens) override it."""
        return None if self.authorized(request.headers) else self.unauthorized(request)

    def __post_init__(self) -> None:
        self._router = Router(routes=list(self.routes()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        if body is None:
            await json_response({"error": "request body too large"}, 413)(scope, receive, send)
            return
        request = Request(scope)
        self.seen.append(Seen(
            request.method, request.url.path, request.url.query,
            tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]), body,
        ))
        replay = _replay(body, receive)
        refusal = self.refusal(request)
        if refusal is not None:
            await refusal(scope, replay, send)
            return
        await self._router(scope, replay, send)


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the already-read body to the routed endpoint once, then waits on
    the real one (so a streaming response still learns when the client goes away)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
