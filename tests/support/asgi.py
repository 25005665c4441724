"""What the tests' small ASGI apps share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


async def read_body(receive: Callable[[], Awaitable[dict[str, Any]]]) -> bytes:
    """The whole request body, however the server chunks it."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body
