"""Dialling the one upstream: the pinned address, TLS verified for the policy's hostname, no
redirects followed, no proxy from the environment, keep-alive pooled. httpx errors are
translated here into gateway errors whose messages name no URL (a query may carry the secret).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from http.cookiejar import CookieJar, DefaultCookiePolicy
from urllib.parse import urlsplit

import httpx

from broker.errors import GatewayTimeout, Reason, UpstreamError
from gateways.credentials import HOP_BY_HOP, Headers
from policies.model import Upstream

# httpx logs each request URL at INFO and httpcore more at DEBUG; with query placement the URL
# carries the secret, so these loggers never go below WARNING in a valetkey process.
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).setLevel(logging.WARNING)

# Content-Length and digests: the body may change length and bytes (redaction); Content-Encoding:
# a compressed body is decoded before redaction (gateways/encodings.py) and sent as identity.
# Trailers never arrive here: httpx (h11) reads and drops them.
RESPONSE_DROPPED = HOP_BY_HOP | frozenset({
    b"content-length", b"content-encoding", b"content-md5", b"digest", b"content-digest", b"repr-digest",
    b"proxy-authenticate", b"alt-svc",
})


class UpstreamClient:
    def __init__(
        self, upstream: Upstream, *, connect: float, read: float, max_connections: int = 256,
        ca_file: str | None = None, transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.upstream = upstream
        # certificates are verified for the policy's hostname (sent as SNI), never the pinned IP
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self._client = httpx.AsyncClient(
            # no cookie jar: one client serves every run, so a cookie set for one run must never be
            # sent on another's request (the sandbox's own Cookie header is stripped, by design)
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
            verify=verify,
            follow_redirects=False,
            trust_env=False,  # never an HTTP(S)_PROXY from the environment
            timeout=httpx.Timeout(read, connect=connect, write=read, pool=connect),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64,
                                keepalive_expiry=30.0),
            transport=transport,
        )
        default_port = 443 if upstream.scheme == "https" else 80
        host = f"[{upstream.host}]" if ":" in upstream.host else upstream.host
        self.host_header = host if upstream.port == default_port else f"{host}:{upstream.port}"

    async def aclose(self) -> None:
        await self._client.aclose()

    async def open(
        self, method: str, address: str, raw_target: bytes, headers: Headers,
        content: bytes | AsyncIterator[bytes],
    ) -> httpx.Response:
        """Send to ``address`` (already checked by the egress guard); returns a streaming response."""
        up = self.upstream
        url = httpx.URL(scheme=up.scheme, host=address, port=up.port, raw_path=raw_target)
        extensions = {"sni_hostname": up.host} if up.scheme == "https" else {}
        request = self._client.build_request(
            method, url, headers=[*headers, (b"host", self.host_header.encode())], content=content,
            extensions=extensions,
        )
        try:
            return await self._client.send(request, stream=True)
        except httpx.ConnectTimeout:
            raise GatewayTimeout("upstream did not accept the connection in time",
                                 Reason.UPSTREAM_CONNECT_TIMEOUT) from None
        except httpx.TimeoutException:
            raise GatewayTimeout("upstream did not answer in time", Reason.UPSTREAM_TIMEOUT) from None
        except httpx.RemoteProtocolError:
            raise UpstreamError("upstream broke the HTTP protocol", Reason.UPSTREAM_PROTOCOL_ERROR) from None
        except httpx.ConnectError as exc:
            if _is_tls(exc):
                raise UpstreamError("upstream TLS certificate did not verify for "
                                    f"{up.host}", Reason.UPSTREAM_TLS_ERROR) from None
            raise UpstreamError(f"upstream unreachable ({type(exc).__name__})",
                                Reason.UPSTREAM_UNREACHABLE) from None
        except httpx.TransportError as exc:
            raise UpstreamError(f"upstream unreachable ({type(exc).__name__})",
                                Reason.UPSTREAM_UNREACHABLE) from None


def _is_tls(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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
