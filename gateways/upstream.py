"""Dialling the one upstream: the pinned address, TLS verified for the policy's hostname, no
redirects followed, no proxy from the environment, no cookies kept, keep-alive pooled
(``gateways/http1.py``). Errors are gateway errors whose messages name no URL (a query may
carry the secret).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from contract.errors import BadRequest, Reason
from gateways.credentials import HOP_BY_HOP, Headers
from gateways.http1 import BODY_EXPECTED, Pool, Response
from policies.model import Upstream

# Content-Length and digests: the body may change length and bytes (redaction); Content-Encoding:
# a compressed body is decoded before redaction (gateways/encodings.py) and sent as identity.
# Trailers never arrive here: gateways/http1.py reads and drops them.
RESPONSE_DROPPED = HOP_BY_HOP | frozenset({
    b"content-length", b"content-encoding", b"content-md5", b"digest", b"content-digest", b"repr-digest",
    b"proxy-authenticate", b"alt-svc",
})


class UpstreamClient:
    def __init__(
        self, upstream: Upstream, *, connect: float, read: float, max_connections: int = 256,
        ca_file: str | None = None, dial_port: int | None = None,
    ) -> None:
        """``dial_port``: the port to connect to when it is not the policy's (the egress proxy's
        test-only resolver map); Host, SNI and certificate checks still use the policy's."""
        self.upstream = upstream
        tls: ssl.SSLContext | None = None
        if upstream.scheme == "https":
            # certificates are verified for the policy's hostname (sent as SNI), never the pinned IP
            tls = ssl.create_default_context(cafile=ca_file)
            tls.set_alpn_protocols(["http/1.1"])
        self._pool = Pool(dial_port or upstream.port, tls=tls, server_hostname=upstream.host, connect=connect,
                          read=read,
                          max_connections=max_connections)
        default_port = 443 if upstream.scheme == "https" else 80
        host = f"[{upstream.host}]" if ":" in upstream.host else upstream.host
        self.host_header = host if upstream.port == default_port else f"{host}:{upstream.port}"
        self._host_line = b"host: " + self.host_header.encode() + b"\r\n"

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def open(
        self, method: str, address: str, raw_target: bytes, headers: Headers,
        content: bytes | AsyncIterator[bytes],
    ) -> Response:
        """Send to ``address`` (already checked by the egress guard); returns a streaming response."""
        verb = method.encode("ascii")
        if isinstance(content, bytes):
            framing = b"content-length: %d\r\n" % len(content) if content or verb in BODY_EXPECTED else b""
        else:
            framing = b"transfer-encoding: chunked\r\n"
        lines = b"".join([k + b": " + v + b"\r\n" for k, v in headers])
        head = b"%b %b HTTP/1.1\r\n%b%b%b\r\n" % (verb, raw_target, self._host_line, lines, framing)
        # every line ends in CRLF and nothing else breaks one: no header injection into the request
        breaks = len(headers) + 3 + (1 if framing else 0)  # request line, host, end
        if head.count(b"\n") != breaks or head.count(b"\r") != breaks or b"\0" in head:
            raise BadRequest("a header or the target holds a line break", Reason.INVALID_REQUEST)
        return await self._pool.request(verb, address, head, content)


def rewrite_location(value: str, upstream: Upstream) -> str:
    """A redirect to the upstream's own origin becomes a relative reference to the gateway;
    any other target passes through (redacted later) — the gateway never follows it."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return value
    if not parts.scheme and not parts.netloc:
        return value
    default = 443 if parts.scheme == "https" else 80
    same = (
        parts.scheme == upstream.scheme
        and (parts.hostname or "").lower() == upstream.host.lower()
        and (port or default) == upstream.port
        and parts.username is None and parts.password is None
    )
    if not same:
        return value
    path = parts.path or "/"
    query = f"?{parts.query}" if parts.query else ""
    return path + query + (f"#{parts.fragment}" if parts.fragment else "")


def response_headers(raw: list[tuple[bytes, bytes]], upstream: Upstream) -> Headers:
    """Upstream response headers minus hop-by-hop, length, coding and digests (see above); the
    status reason is never forwarded (ASGI sends the standard phrase)."""
    named = {
        part.strip().lower().encode()
        for k, v in raw if k.lower() == b"connection"
        for part in v.decode("latin-1").split(",") if part.strip()
    }
    out: Headers = []
    for key, value in raw:
        name = key.lower()
        if name in RESPONSE_DROPPED or name in named:
            continue
        if name == b"location":
            value = rewrite_location(value.decode("latin-1"), upstream).encode("latin-1")
        out.append((name, value))
    return out
