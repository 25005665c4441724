"""The one reader of JSON request bodies: every broker route that takes a body reads it here.

Size first, from ``Content-Length`` and again while reading (``413 body_too_large`` past
``MAX_BODY``), then the strict profile of ``contract.strictjson``: UTF-8 without BOM, an object,
no member name twice at any depth, depth bounded before parsing (``400 invalid_json``,
``duplicate_member``, ``json_too_deep``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from contract.errors import PayloadTooLarge
from contract.strictjson import parse_object

MAX_BODY = 64 * 1024


async def read_json_object(request: Request) -> dict[str, Any]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise PayloadTooLarge(f"request body is larger than {MAX_BODY} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise PayloadTooLarge(f"request body is larger than {MAX_BODY} bytes")
    return parse_object(bytes(body), "request body")
