"""Tunnel mode: the ClientHello's server name is checked, then the bytes pass unread both ways.

    await tunnel(hub, admission, transport, first, record)

Before anything is dialled the ClientHello must arrive whole within the hello timeout and name the
CONNECT host (``sni_missing``, ``sni_mismatch``, ``client_hello_invalid``,
``client_hello_timeout``: the connection is closed, nothing went upstream). Then the pinned
address is dialled, the ClientHello sent on, and from there the kernel relays the bytes
(``proxy/splice.py``: socket → pipe → socket, never copied into Python; asyncio protocols where
``splice`` is missing), with flow control (a side whose peer cannot keep up stops being read)
and at most a pipe's worth of bytes in flight each way. A side's end of stream half-closes the
other; the tunnel ends when both directions have ended or a side fails, when the run's token
expires, or when its run is revoked (the revocation watcher cancels the task holding it).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from contract.errors import BadRequest, GatewayTimeout, Reason, TokenInvalid, UpstreamError
from gateways.audit import AuditRecord
from proxy import splice
from proxy.clienthello import server_name
from proxy.connect import Admission
from proxy.hub import Hub

HIGH_WATER = 1024 * 1024


class _Side(asyncio.Protocol):
    """One side of a tunnel: what it reads is written to its peer."""

    def __init__(self, done: asyncio.Future[None], counter: list[int]) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.done = done
        self.counter = counter  # [bytes read on this side]
        self.pending = bytearray()  # read before the peer existed (the hello)
        self.eof = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=HIGH_WATER)

    def data_received(self, data: bytes) -> None:
        self.counter[0] += len(data)
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.pending += data

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.eof or not peer.transport.can_write_eof():
            if not self.done.done():  # both directions have ended (or cannot half-close): done
                self.done.set_result(None)
            return False
        peer.transport.write_eof()
        return True  # half-close: the other direction may still be sending

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Hello(_Side):
    """The client side while the ClientHello arrives."""

    def __init__(self, done: asyncio.Future[None], counter: list[int], first: bytes) -> None:
        super().__init__(done, counter)
        self.pending += first
        self.more = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.more.set()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.more.set()


async def read_hello(side: _Hello, host: str, within: float) -> None:
    """Wait for a whole ClientHello naming ``host``; raises the refusal otherwise."""
    try:
        async with asyncio.timeout(within):
            while True:
                hello = server_name(bytes(side.pending))
                if hello.complete:
                    break
                side.more.clear()
                if side.done.done():
                    raise BadRequest("the client closed before its ClientHello ended",
                                     Reason.CLIENT_HELLO_INVALID)
                await side.more.wait()
    except TimeoutError:
        raise BadRequest(f"no ClientHello within {within:g}s", Reason.CLIENT_HELLO_TIMEOUT) from None
    if hello.sni is None:
        raise BadRequest("the ClientHello names no server (SNI); tunnels are by name only",
                         Reason.SNI_MISSING)
    if hello.sni != host:
        raise BadRequest("the ClientHello names another host than the CONNECT", Reason.SNI_MISMATCH)


async def hello(client: asyncio.Transport, first: bytes, host: str, within: float) -> bytes:
    """Read the client's ClientHello (terminate mode): it must name ``host``. Returns every byte
    read, for the TLS layer that takes the connection over; reading is paused again."""
    loop = asyncio.get_running_loop()
    side = _Hello(loop.create_future(), [0], first)
    side.connection_made(client)
    client.set_protocol(side)
    client.resume_reading()
    try:
        await read_hello(side, host, within)
    finally:
        client.pause_reading()
    return bytes(side.pending)


async def tunnel(hub: Hub, admission: Admission, client: asyncio.Transport, first: bytes,
                 record: AuditRecord) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    sent, received = [0], [0]
    near = _Hello(done, sent, first)
    near.connection_made(client)
    client.set_protocol(near)
    client.resume_reading()
    upstream: asyncio.Transport | None = None
    sockets: list[socket.socket] = []
    relay: splice.Relay | None = None
    try:
        await read_hello(near, admission.route.host, hub.settings.hello_timeout)
        dial = hub.settings.connect_to.get((admission.route.host, admission.route.port))
        port = dial[1] if dial else admission.route.port
        within = hub.settings.gateway.connect_timeout
        if splice.AVAILABLE and not client.get_write_buffer_size():
            client.pause_reading()  # what arrives meanwhile waits in the kernel for the relay
            sockets.append(await _dial(loop, admission.target.address, port, within))
            sockets.insert(0, _detach(client))
            await loop.sock_sendall(sockets[1], bytes(near.pending))
            relay = splice.Relay(loop, sockets[0], sockets[1], sent, received)
            done = relay.done
        else:
            far = _Side(done, received)
            upstream = await _connect(loop, lambda: far, admission.target.address, port, within)
            near.peer, far.peer = far, near
            upstream.write(bytes(near.pending))
        near.pending.clear()
        record.status = 200
        untrack = hub.base.revocations.track(admission.claims, admission.route.name)
        try:
            async with asyncio.timeout(max(0.0, admission.claims.exp - time.time())):
                await done
        except TimeoutError:  # the run's token expired: so does its tunnel
            raise TokenInvalid("the run's proxy credential expired while its tunnel was open",
                               check="expired") from None
        finally:
            untrack()
    finally:
        record.bytes_in, record.bytes_out = sent[0], received[0]
        if relay is not None:
            relay.close()
        client.close()
        for sock in sockets:
            sock.close()
        if upstream is not None:
            upstream.close()


def _detach(transport: asyncio.Transport) -> socket.socket:
    """The client's socket, taken from its transport for the kernel relay: a duplicate descriptor,
    then the transport is aborted (it closes only its own descriptor; its buffer is empty)."""
    raw = transport.get_extra_info("socket")
    sock = socket.socket(fileno=os.dup(raw.fileno()))
    sock.setblocking(False)
    transport.set_protocol(asyncio.Protocol())  # nothing listens to the old transport's end
    transport.abort()
    return sock


async def _dial(loop: asyncio.AbstractEventLoop, address: str, port: int, within: float) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        async with asyncio.timeout(within):
            await loop.sock_connect(sock, (address, port))
    except TimeoutError:
        sock.close()
        raise GatewayTimeout("the destination did not accept a connection in time",
                             Reason.UPSTREAM_CONNECT_TIMEOUT) from None
    except OSError:
        sock.close()
        raise UpstreamError("the destination refused the connection", Reason.UPSTREAM_UNREACHABLE) from None
    except BaseException:
        sock.close()
        raise
    return sock


async def _connect(loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.Protocol], address: str,
                   port: int, within: float) -> asyncio.Transport:
    """``_dial``, then the socket as an asyncio transport (the relay where splice(2) is missing)."""
    sock = await _dial(loop, address, port, within)
    try:
        transport, _ = await loop.create_connection(factory, sock=sock)
    except BaseException:
        sock.close()
        raise
    return transport
