"""Serving a gateway: uvicorn with its httptools (llhttp) protocol, and four changes.

- Malformed HTTP gets our JSON error shape, ``400 {"error": "malformed_request"}``, and the
  connection is closed (uvicorn answers in plain text).
- The request head (target and headers) and the trailers are bounded: ``MAX_HEAD`` bytes,
  counted as they arrive (llhttp itself has no limit, and httptools buffers a header until it
  ends).
- A target that is not origin-form (``http://host/…``, ``*``, a CONNECT authority) reaches the
  pipeline as it was sent, so ``check_request`` refuses it with its own reason code and audit
  line (uvicorn would parse out just the path of an absolute URL).
- CONNECT never keeps its connection: after the refusal the connection closes.
- Writes a response makes in one turn of the event loop leave in one ``send``: status line,
  headers, body and the chunked terminator of a small response are one segment, not three
  (each loopback ``send`` costs tens of microseconds; a stream's pieces still leave at once).
- Connections are bounded: at most ``max_connections`` per process (one over the cap is answered
  ``503 {"error": "connection_limit"}`` and closed at once, before anything is read); a request
  head must arrive within ``header_timeout`` of the connection or of its first byte (else
  ``408 request_head_timeout`` if it had begun, a silent close if nothing came); an idle
  kept-alive connection closes after ``keepalive_timeout`` (uvicorn's own timer).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from contract.errors import Reason
from gateways.settings import GatewaySettings

MAX_HEAD = 64 * 1024
READ_SLACK = 256 * 1024  # one read may carry the end of a head and the start of a body


class HeadTooLarge(ValueError):
    """Raised inside a parser callback: httptools turns it into a parse error (a 400)."""


class CorkedWrites:
    """Stands in for the transport of a response cycle: writes are gathered and sent together
    at the end of the current turn of the event loop (``call_soon``), or before a close."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending = []
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


_REFUSED = json.dumps({"error": Reason.CONNECTION_LIMIT.value,
                       "detail": "too many connections to this gateway process; retry shortly"}).encode()
REFUSED_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n%b"
                    % (len(_REFUSED), _REFUSED))


class GatewayProtocol(HttpToolsProtocol):
    max_connections = 4096  # per process; ``config`` puts the settings' values on the uvicorn Config
    header_timeout = 10.0
    _since_body = 0  # bytes received since the message began or body bytes last arrived
    _seen = 0  # bytes of target and headers parsed so far
    _in_head = True
    _head_timer: asyncio.TimerHandle | None = None
    _began = False  # a byte of the current request has arrived

    def data_received(self, data: bytes) -> None:
        if not self.over_bound(data):
            super().data_received(data)

    def over_bound(self, data: bytes) -> bool:
        """Bytes that are neither head nor body (chunk framing, trailers) since the last body
        bytes: httptools buffers a trailer until its line ends, so this bounds that too. True
        when over the bound (answered and closed)."""
        self._since_body += len(data)
        if self._since_body <= MAX_HEAD + READ_SLACK:
            return False
        if self._in_head or self.cycle is None or self.cycle.response_complete:
            self.send_400_response(f"request head or trailers over {MAX_HEAD} bytes")
        else:
            self.transport.close()  # a response is under way: no room for a 400
        return True

    def on_body(self, body: bytes) -> None:
        self._since_body = 0
        super().on_body(body)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._seen = True, 0
        self._began = True
        if self._head_timer is None:  # a later request on a kept-alive connection: from its first byte
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._seen += size
        if self._seen > MAX_HEAD:
            raise HeadTooLarge(f"request head over {MAX_HEAD} bytes")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # plain attributes of the uvicorn Config: it is pickled into each --workers process
        self.max_connections = getattr(self.config, "valetkey_max_connections", self.max_connections)
        self.header_timeout = getattr(self.config, "valetkey_header_timeout", self.header_timeout)
        if len(self.server_state.connections) >= self.max_connections:
            # refused before anything is read or allocated: the descriptor is released at once
            transport.write(REFUSED_RESPONSE)
            transport.close()
            self.transport, self.cycle = transport, None  # type: ignore[assignment]
            return
        super().connection_made(transport)
        self._corked = CorkedWrites(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if not hasattr(self, "_corked"):  # a refused connection: never registered
            return
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm_head_timer()  # a pipelined head waits on our own response: not the client's fault
            return
        if not self._began:
            self.transport.close()  # nothing arrived: nothing to answer
            return
        body = json.dumps({"error": Reason.REQUEST_HEAD_TIMEOUT.value,
                           "detail": f"request head not received within {self.header_timeout:g}s"}).encode()
        self._corked.flush()
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(body), body))
        self.transport.close()

    def on_response_complete(self) -> None:
        self._corked.flush()  # the last write of a response leaves now, not after the audit line
        super().on_response_complete()

    def shutdown(self) -> None:
        self._corked.flush()
        super().shutdown()

    def on_headers_complete(self) -> None:
        self._in_head, self._since_body = False, 0
        self._cancel_head_timer()
        target = self.url
        connect = self.parser.get_method() == b"CONNECT"
        origin_form = target.startswith(b"/") and not connect
        if not origin_form:
            self.url = b"/"  # parsed as a harmless path; the pipeline sees the real target below
        super().on_headers_complete()
        self.cycle.transport = cast(asyncio.Transport, self._corked)
        if origin_form:
            return
        raw_path, _, query = target.partition(b"?")
        self.scope["raw_path"] = raw_path  # refused by check_request; never audited as sent
        self.scope["path"] = raw_path.decode("latin-1")
        self.scope["query_string"] = query
        if connect:
            self.cycle.keep_alive = False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._since_body = True, 0
        self._began = False

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": Reason.MALFORMED_REQUEST.value, "detail": msg}).encode()
        self._corked.flush()  # an earlier response still gathered goes first
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(body), body)
        )
        self.transport.close()


def config(app: Any, settings: GatewaySettings, log_level: str = "warning",
           workers: int = 1) -> uvicorn.Config:
    cfg = uvicorn.Config(
        app, host=settings.host, port=settings.port, http=GatewayProtocol, loop="asyncio",
        log_level=log_level, access_log=False, server_header=False, date_header=False, lifespan="on",
        workers=workers, timeout_keep_alive=settings.keepalive_timeout,
        proxy_headers=False,  # the client address is the sandbox's, never a header's claim
    )
    cfg.valetkey_max_connections = settings.max_connections  # type: ignore[attr-defined]
    cfg.valetkey_header_timeout = float(settings.header_timeout)  # type: ignore[attr-defined]
    return cfg


def from_env() -> Any:
    """App factory for uvicorn workers: upstream from ``VALETKEY_GATEWAY_UPSTREAM``."""
    import os

    from gateways.app import GatewayApp
    from gateways.settings import GatewaySettings
    from policies.load import load_policy_dir

    name = os.environ["VALETKEY_GATEWAY_UPSTREAM"]
    settings = GatewaySettings.from_env(name)
    policies = load_policy_dir(settings.policy_dir)
    return GatewayApp(settings, policies.upstreams[name], alerting=policies.alerting)
