"""A lean HTTP/1.1 client for the gateway's one origin: an asyncio protocol per connection,
httptools (llhttp, C) to parse responses, and a LIFO stack of idle keep-alive connections.

Why not httpx here: its pool (httpcore) walks every pooled connection with a socket poll on each
request and each release — about 18 % of a gateway worker's CPU under load (docs/benchmarks.md).
Here a connection the upstream closed is noticed by the event loop itself (``connection_lost``),
so taking an idle one costs a pop. The client keeps no cookies, follows no redirects and reads
no proxy settings: it sends exactly the request it is given.

Errors are gateway errors with stable reason codes and messages that name no URL (a query may
carry the secret): ``upstream_connect_timeout``, ``upstream_timeout``, ``upstream_unreachable``,
``upstream_tls_error``, ``upstream_protocol_error``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, cast

import httptools

from contract.errors import GatewayTimeout, Reason, UpstreamError, ValetkeyError

Headers = list[tuple[bytes, bytes]]

HIGH_WATER = 256 * 1024  # response bytes buffered before the upstream socket stops being read
LOW_WATER = 64 * 1024
MAX_HEAD = 256 * 1024  # response status line and headers: llhttp itself sets no limit
COALESCE = 64 * 1024  # request bodies up to this size go out in one write with the head
IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE"})  # RFC 9110 §9.2.2
BODY_EXPECTED = frozenset({b"POST", b"PUT", b"PATCH"})


def _broken(what: str) -> UpstreamError:
    return UpstreamError(what, Reason.UPSTREAM_PROTOCOL_ERROR)


def _expire(future: asyncio.Future[Any], what: str) -> None:
    if not future.done():
        future.set_exception(GatewayTimeout(what, Reason.UPSTREAM_TIMEOUT))


class _Connection(asyncio.Protocol):
    """One upstream connection; serves one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self._loop = loop
        self._timeout = read_timeout  # between bytes, and for a write to drain
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.idle_since = 0.0
        self.reusable = False
        self._head_only = False
        self._status = 0
        self._headers: Headers = []
        self._head: asyncio.Future[tuple[int, Headers]] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._reading_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._complete = False
        self._framed = False  # Content-Length or chunked: EOF before the end is a broken response
        self._since_body = 0  # received while waiting for the response head
        self._header_bytes = 0  # parsed header names and values of the current response
        self.error: ValetkeyError | None = None

    # ---- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self._head is None or self._complete:  # bytes outside a response: out of step
            self.reusable = False
            if self.transport is not None:
                self.transport.close()
            return
        # bytes that are neither body nor a finished head (a header or trailer that never ends:
        # httptools buffers it) since the last body bytes
        self._since_body += len(data)
        if self._since_body > 2 * MAX_HEAD:
            self._fail(_broken(f"upstream response head or trailers over {MAX_HEAD} bytes"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(_broken("upstream tried to switch protocols"))
        except httptools.HttpParserError:
            self._fail(_broken("upstream broke the HTTP protocol"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.resume_writing()  # a write waiting for the buffer to drain fails now, not at its timeout
        if self._head is None or self._complete:
            return
        if exc is None and self._head.done() and not self._framed and self.error is None:
            self._complete = True  # a response delimited by closing the connection
            self._wake()
            return
        self._fail(_broken("upstream closed the connection mid-response"), close=False)

    def pause_writing(self) -> None:
        if self._drain is None:
            self._drain = self._loop.create_future()

    def resume_writing(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    # ---- httptools callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._complete:  # a second response to one request: the connection is out of step
            self.reusable = False
            raise ValueError("bytes after the response")
        self._headers = []
        self._framed = False
        self._header_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._status:
            return  # a trailer (after a chunked body): dropped, never a response header
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEAD:
            raise ValueError("response head too large")  # a parser error: upstream_protocol_error
        self._headers.append((name, value))
        low = name.lower()
        if low == b"content-length" or (low == b"transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status == 101:
            raise httptools.HttpParserUpgrade("upgrade")
        if 100 <= status < 200:
            return  # informational (103 Early Hints …): skipped; the final response follows
        self._status = status
        head = self._head
        if head is not None and not head.done():
            head.set_result((status, self._headers))
        if self._head_only:  # no body follows a HEAD response, whatever Content-Length says
            self._complete = True
            self.reusable = False

    def on_body(self, body: bytes) -> None:
        self._since_body = 0
        if self._complete:
            return
        self._chunks.append(bytes(body))
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._status == 0 or self._complete:
            return  # the end of an informational response, or of a HEAD we already ended
        self._complete = True
        self.reusable = self._parser.should_keep_alive()
        self._wake()

    # ---- the exchange -----------------------------------------------------------------------
    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: ValetkeyError, close: bool = True) -> None:
        self.reusable = False
        if self.error is None:
            self.error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved here: a request already cancelled never awaits it
        self._wake()
        if close and self.transport is not None:
            self.transport.close()

    def begin(self, head_only: bool) -> asyncio.Future[tuple[int, Headers]]:
        self._head = self._loop.create_future()
        self._head_only = head_only
        self._since_body = 0
        self._status = 0
        self._complete = False
        self.reusable = False
        self.error = None
        return self._head

    async def write(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        if self.lost or self.transport is None or self.transport.is_closing():
            self.lost = True  # going away before connection_lost says so: a kept-alive one is retried
            raise UpstreamError("upstream closed the connection", Reason.UPSTREAM_UNREACHABLE)
        self.transport.write(data)
        if self._drain is not None:
            try:
                async with asyncio.timeout(self._timeout):
                    await asyncio.shield(self._drain)
            except TimeoutError:
                raise GatewayTimeout("upstream did not take the request body in time",
                                     Reason.UPSTREAM_TIMEOUT) from None

    async def read(self) -> bytes:
        """The next piece of the response body; ``b""`` once it is complete."""
        while not self._chunks:
            if self._complete:  # bytes the upstream sent after it only cost it the connection
                return b""
            if self.error is not None:
                raise self.error
            self._waiter = self._loop.create_future()
            await self.wait(self._waiter, "upstream stalled mid-response")
        if len(self._chunks) == 1:
            data = self._chunks.popleft()
        else:
            data = b"".join(self._chunks)
            self._chunks.clear()
        self._buffered = 0
        if self._reading_paused and self._buffered < LOW_WATER and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    @property
    def complete(self) -> bool:
        return self._complete and not self._chunks

    @property
    def answered(self) -> bool:
        return self._status != 0

    async def wait(self, future: asyncio.Future[Any], what: str) -> Any:
        """``future``'s result, or ``upstream_timeout`` after the read timeout (a timer handle:
        cheaper than ``asyncio.timeout`` on every read of the hot path)."""
        timer = self._loop.call_later(self._timeout, _expire, future, what)
        try:
            return await future
        finally:
            timer.cancel()

    def finished(self) -> bool:
        return self._complete and not self._chunks and self.error is None

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


class Response:
    """A response whose head has arrived; the body streams from ``iter_body``. ``aclose`` always."""

    __slots__ = ("_closed", "_conn", "_pool", "headers", "status")

    def __init__(self, pool: Pool, conn: _Connection, status: int, headers: Headers) -> None:
        self.status, self.headers = status, headers
        self._conn, self._pool, self._closed = conn, pool, False

    async def iter_body(self) -> AsyncIterator[bytes]:
        while chunk := await self._conn.read():
            yield chunk

    @property
    def complete(self) -> bool:
        """The body has ended and every byte of it was given out by ``iter_body``."""
        return self._conn.complete

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.release(self._conn)


class Pool:
    """Connections to one upstream (its pinned address), at most ``max_connections`` in use;
    up to ``max_idle`` kept alive for ``keepalive`` seconds, newest reused first."""

    def __init__(self, port: int, *, tls: ssl.SSLContext | None, server_hostname: str | None,
                 connect: float, read: float, max_connections: int = 256, max_idle: int = 64,
                 keepalive: float = 30.0) -> None:
        self._port, self._tls, self._sni = port, tls, server_hostname
        self._connect, self._read = connect, read
        self._max_idle, self._keepalive = max_idle, keepalive
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._idle_address = ""
        self._open: set[_Connection] = set()

    async def request(self, method: bytes, address: str, head: bytes, body: bytes | AsyncIterator[bytes],
                      ) -> Response:
        """Send ``head`` (request line and headers, framing included) and ``body`` to ``address``;
        returns once the response head has arrived."""
        try:
            async with asyncio.timeout(self._connect):
                await self._slots.acquire()
        except TimeoutError:
            raise GatewayTimeout("no upstream connection became free in time",
                                 Reason.UPSTREAM_TIMEOUT) from None
        try:
            conn, reused = self._take(address), True
            if conn is None:
                conn, reused = await self._dial(address), False
            try:
                return await self._exchange(conn, method, head, body)
            except UpstreamError:
                # a kept-alive connection the upstream closed as we sent: retry once, fresh, when
                # nothing came back and the request is safe to repeat (RFC 9110 §9.2.2)
                replayable = method in IDEMPOTENT and isinstance(body, bytes)
                if not (reused and replayable and conn.lost and not conn.answered):
                    raise
                conn = await self._dial(address)
                return await self._exchange(conn, method, head, body)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(self, conn: _Connection, method: bytes, head: bytes,
                        body: bytes | AsyncIterator[bytes]) -> Response:
        try:
            pending = conn.begin(head_only=method == b"HEAD")
            if isinstance(body, bytes):
                if len(body) <= COALESCE:
                    await conn.write(head + body)
                else:
                    await conn.write(head)
                    await conn.write(body)
            else:
                await conn.write(head)
                async for chunk in body:
                    if chunk:
                        await conn.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                await conn.write(b"0\r\n\r\n")
            status, headers = await conn.wait(pending, "upstream did not answer in time")
        except BaseException:
            self._discard(conn)
            raise
        return Response(self, conn, status, headers)

    def _take(self, address: str) -> _Connection | None:
        if address != self._idle_address:  # the pinned address moved: old connections go
            for conn in self._idle:
                self._discard(conn)
            self._idle, self._idle_address = [], address
        expired = asyncio.get_running_loop().time() - self._keepalive
        while self._idle:
            conn = self._idle.pop()
            closing = conn.transport is None or conn.transport.is_closing()
            if not conn.lost and not closing and conn.idle_since > expired:
                return conn
            self._discard(conn)
        return None

    async def _dial(self, address: str) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, self._read), host=address, port=self._port, ssl=self._tls,
                    server_hostname=self._sni if self._tls else None,
                )
        except TimeoutError:
            raise GatewayTimeout("upstream did not accept the connection in time",
                                 Reason.UPSTREAM_CONNECT_TIMEOUT) from None
        except ssl.SSLError:
            raise UpstreamError(f"upstream TLS certificate did not verify for {self._sni}",
                                Reason.UPSTREAM_TLS_ERROR) from None
        except OSError as exc:
            raise UpstreamError(f"upstream unreachable ({type(exc).__name__})",
                                Reason.UPSTREAM_UNREACHABLE) from None
        self._open.add(conn)
        return conn

    def release(self, conn: _Connection) -> None:
        self._slots.release()
        if conn.finished() and conn.reusable and not conn.lost and len(self._idle) < self._max_idle:
            conn.idle_since = conn._loop.time()
            conn._head = None
            self._idle.append(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    async def aclose(self) -> None:
        for conn in list(self._open):
            self._discard(conn)
        self._idle = []
        await asyncio.sleep(0)  # let the transports finish closing
