"""The proxy's connections: the gateway's HTTP/1.1 protocol (bounds, timers, our error shape) with
CONNECT taken over, and a second instance of it speaking inside each terminated tunnel.

- A CONNECT as the first request of a connection is parsed by llhttp like any head (same size
  bound and head timer), then handed to ``handle_connect``: the decision (``proxy.connect``),
  then ``200 Connection established`` and the tunnel, or the refusal and a close. A CONNECT later
  on a kept-alive connection, or inside a tunnel, reaches the pipeline and is refused there
  (``method_refused``).
- Terminate mode: TLS with a leaf for the CONNECT host (``proxy.certs``), then a fresh
  ``InnerProtocol`` on the decrypted stream; the ASGI app finds the tunnel in the scope
  (``valetkey.tunnel``) and runs the pipeline for it.
- Anything else is a plain-http proxy request (absolute-form target) for the ASGI app.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from asyncio import sslproto
from collections.abc import Callable
from typing import Any

import httptools

from contract.errors import BadRequest, Decision, Reason, ValetkeyError, render
from gateways.audit import AuditRecord
from gateways.server import GatewayProtocol
from policies.model import TlsMode
from proxy.connect import TUNNEL_KEY, Admission, admit, parse_authority, proxy_status
from proxy.hub import Hub
from proxy.tunnel import hello, tunnel

log = logging.getLogger("valetkey.proxy")
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
HANDSHAKE_TIMEOUT = 10  # seconds
HUB_KEY = "valetkey.proxy"  # the lifespan state's key of the process's Hub


class InnerProtocol(GatewayProtocol):
    """HTTP/1.1 inside a terminated tunnel: every request's scope carries the tunnel."""

    def __init__(self, *args: Any, admission: Admission, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.admission = admission
        self.closed: asyncio.Future[None] = self.loop.create_future()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.scope[TUNNEL_KEY] = self.admission  # type: ignore[literal-required]

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.closed.done():
            self.closed.set_result(None)


class ProxyProtocol(GatewayProtocol):
    """The listener's protocol: plain-http proxy requests, and CONNECT taken over."""

    _connect: tuple[bytes, list[tuple[bytes, bytes]]] | None = None
    _requests = 0

    def on_message_begin(self) -> None:
        self._requests += 1
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self.parser.get_method() == b"CONNECT" and self._requests == 1:
            self._in_head, self._since_body = False, 0
            self._cancel_head_timer()
            self._connect = (self.url, list(self.headers))
            return  # no ASGI cycle: the tunnel takes the connection
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self._connect is None:
            super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        if self._connect is not None or self.over_bound(data):
            return  # paused after a CONNECT head: nothing more is read here
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade as upgrade:
            if self._connect is not None:
                self._take_over(data[upgrade.args[0]:])
            else:  # an Upgrade header on a plain request: never honoured here
                self.send_400_response("protocol upgrades are not proxied")

    def _take_over(self, rest: bytes) -> None:
        """The end of a CONNECT head: from here the connection is the tunnel's (``rest`` is what
        the client sent after the head, the start of its side of the tunnel)."""
        assert self._connect is not None
        self.transport.pause_reading()  # it still counts against the connection limit until it ends
        hub = self.app_state.get(HUB_KEY)
        if not isinstance(hub, Hub):
            self.transport.close()
            return
        authority, headers = self._connect
        task = self.loop.create_task(handle_connect(hub, self, authority, headers, rest))
        hub.tunnels.add(task)
        task.add_done_callback(hub.tunnels.discard)


def _refusal(exc: ValetkeyError, request_id: str) -> tuple[int, bytes]:
    status, headers, body = render(exc, status=proxy_status(exc), request_id=request_id)
    reason = {407: "Proxy Authentication Required", 403: "Forbidden", 400: "Bad Request",
              502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}.get(status, "Error")
    lines = b"".join(k + b": " + v + b"\r\n" for k, v in headers if k.lower() != b"content-length")
    return status, (b"HTTP/1.1 %d %b\r\n%bcontent-length: %d\r\nconnection: close\r\n\r\n%b"
                    % (status, reason.encode(), lines, len(body), body))


async def handle_connect(hub: Hub, protocol: ProxyProtocol, authority: bytes,
                         headers: list[tuple[bytes, bytes]],
                         rest: bytes) -> None:
    transport = protocol.transport
    started = time.perf_counter()
    record = AuditRecord(request_id=os.urandom(16).hex(), upstream="-", method="CONNECT",
                         path=authority.decode("latin-1")[:300])
    expires = 0
    answered = False
    release: Callable[[], None] | None = None
    try:
        host, port = parse_authority(authority)
        admission = await admit(hub, host, port, headers, record)
        expires = admission.claims.exp
        if admission.route.tls is TlsMode.TUNNEL:  # a tunnel holds one of the run's slots throughout
            release = admission.gateway.slots.acquire(admission.claims.sub)
        transport.write(ESTABLISHED)
        answered = True
        record.decision, record.reason = Decision.ALLOW, Reason.OK.value
        if admission.route.tls is TlsMode.TUNNEL:
            await tunnel(hub, admission, transport, rest, record)
        else:
            await terminate(hub, protocol, admission, transport, rest, record)
    except ValetkeyError as exc:
        record.decision, record.reason = Decision.of(exc), exc.code
        if not answered:
            record.status, refusal = _refusal(exc, record.request_id)
            transport.write(refusal)
        transport.close()
    except asyncio.CancelledError as cancel:
        task = asyncio.current_task()
        if not str(cancel.args[0] if cancel.args else "").startswith("revoked") or task is None:
            transport.close()
            raise
        task.uncancel()
        record.decision, record.reason = Decision.DENY, Reason.TOKEN_REVOKED.value
        transport.close()
    except Exception as exc:  # a bug: answer if nothing was, record it, close, keep serving
        record.decision, record.reason = Decision.ERROR, Reason.INTERNAL_ERROR.value
        log.error('{"event":"internal_error","request_id":"%s","type":"%s"}', record.request_id,
                  type(exc).__name__)
        if not answered:
            record.status, refusal = _refusal(ValetkeyError("internal error", Reason.INTERNAL_ERROR),
                                              record.request_id)
            transport.write(refusal)
        transport.close()
    finally:
        if release is not None:
            release()
        protocol.connections.discard(protocol)
        record.duration_ms = round((time.perf_counter() - started) * 1000, 3)
        hub.base.audit.write(record, expires)


async def terminate(hub: Hub, protocol: ProxyProtocol, admission: Admission, transport: asyncio.Transport,
                    rest: bytes, record: AuditRecord) -> None:
    """The ClientHello must name the CONNECT host (read and checked first, as in tunnel mode);
    then TLS with a leaf for that host, and HTTP/1.1 inside, one audit line per request."""
    first = await hello(transport, rest, admission.route.host, hub.settings.hello_timeout)
    loop = asyncio.get_running_loop()
    context = hub.leaves.context(admission.route.host)
    if not hub.leaves.cached(admission.route.host):  # a new wildcard name: minted off the loop
        context = await asyncio.to_thread(hub.leaves.context, admission.route.host)
    inner = InnerProtocol(config=protocol.config, server_state=protocol.server_state,
                          app_state=protocol.app_state, _loop=loop, admission=admission)
    try:
        await start_tls(loop, transport, inner, context, first)
    except (OSError, TimeoutError) as exc:
        raise BadRequest(f"the TLS handshake failed ({type(exc).__name__})",
                         Reason.TLS_HANDSHAKE_FAILED) from None
    record.status = 200
    protocol.connections.discard(protocol)  # the inner connection counts from here on
    await inner.closed


async def start_tls(loop: asyncio.AbstractEventLoop, transport: asyncio.Transport, inner: asyncio.Protocol,
                    context: ssl.SSLContext, first: bytes) -> None:
    """``loop.start_tls`` for a connection whose first TLS bytes were already read (the ClientHello
    we checked): asyncio's own TLS protocol, fed those bytes before the socket is read again.
    ``inner.connection_made`` gets the TLS transport once the handshake is done."""
    waiter: asyncio.Future[None] = loop.create_future()
    tls = sslproto.SSLProtocol(loop, inner, context, waiter, server_side=True, call_connection_made=True,
                               ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
    transport.set_protocol(tls)
    tls.connection_made(transport)
    buffer = tls.get_buffer(len(first))
    buffer[:len(first)] = first
    tls.buffer_updated(len(first))
    transport.resume_reading()
    try:
        await waiter
    except BaseException:
        transport.close()
        raise


