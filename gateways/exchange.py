"""One request's state as it moves through the gateway's pipeline, and the ASGI types it speaks."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from contract.claims import AccessClaims
from gateways.audit import AuditRecord, masked_path
from gateways.credentials import Headers, forwarded_headers
from gateways.paths import CanonicalPath
from gateways.sources.cache import Held
from policies.model import Injection, Purpose

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Exchange:
    """One request's state as it moves through the steps."""

    scope: dict[str, Any]
    receive: Receive
    send: Send
    record: AuditRecord
    headers: Headers
    query: bytes
    started: float = field(default_factory=time.perf_counter)
    path: CanonicalPath | None = None
    claims: AccessClaims | None = None
    purpose: Purpose | None = None
    body: bytes | AsyncIterator[bytes] = b""
    upstream_headers: Headers = field(default_factory=list)
    upstream_query: bytes = b""
    response_started: bool = False
    release_slot: Callable[[], None] | None = None
    held: Held[Any] | None = None  # the run's issued credential (a credential source), or None
    _forwarded: Headers | None = None

    def forwarded(self, injection: Injection) -> Headers:
        """The client headers that may leave for the upstream (``forwarded_headers``), worked out
        once per request: the run-token check scans them, then injection or stripping sends them."""
        if self._forwarded is None:
            self._forwarded = forwarded_headers(self.headers, injection)
        return self._forwarded

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    def header(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k == name]


def new_exchange(scope: dict[str, Any], receive: Receive, send: Send, upstream: str) -> Exchange:
    query = bytes(scope.get("query_string", b""))
    raw_path = bytes(scope.get("raw_path") or scope["path"].encode())
    record = AuditRecord(
        request_id=os.urandom(16).hex(), upstream=upstream, method=str(scope["method"])[:16],
        path=masked_path(raw_path.decode("latin-1")[:512], query),
    )
    return Exchange(scope, receive, send, record, list(scope["headers"]), query)
