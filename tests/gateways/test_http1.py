"""The gateway's own HTTP/1.1 client (gateways/http1.py) against a real TCP server that answers
each case byte for byte: keep-alive reuse, the upstream closing kept-alive connections, retries
only where RFC 9110 allows them, framing (HEAD, 1xx, close-delimited, chunked uploads) and every
failure as a gateway error with its reason code."""

from __future__ import annotations

import asyncio
import socket
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contract.errors import ValetkeyError
from gateways.http1 import HIGH_WATER, Pool
from gateways.upstream import UpstreamClient
from policies.load import load_policy_dir
from policies.model import Upstream

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class Server:
    """A real listening socket on loopback; each accepted connection runs ``script``."""

    script: Script
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        body = b""
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                body = await reader.readexactly(int(line.split(b":")[1]))
        if b"transfer-encoding: chunked" in head.lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
        self.requests.append(head + body)
        return head + body


def answer(*responses: bytes, close: bool = False) -> Script:
    """Read a request, send the next response; keep the connection unless ``close``."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, srv: Server) -> None:
        for response in responses:
            await srv.read_request(reader)
            writer.write(response)
            await writer.drain()
        if not close:
            await reader.read()  # wait for the client to hang up
    return script


def upstream_at(port: int) -> Upstream:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "up.yaml").write_text(f"""version: 1
kind: upstream
name: up
base_url: http://127.0.0.1:{port}
allow_private: true
secret: {{path: valetkey/up/upstream, field: token}}
inject: {{header: Authorization, format: "Bearer {{secret}}"}}
env: {{placeholder: UP_TOKEN, base_url: UP_URL}}
purposes:
  any: {{why: Everything., methods: [GET, POST], paths: ["/up"]}}
""")
        return load_policy_dir(tmp).upstreams["up"]


def pool(port: int, read: float = 2.0) -> Pool:
    return Pool(port, tls=None, server_hostname=None, connect=2.0, read=read)


async def fetch(p: Pool, method: bytes = b"GET", body: bytes | AsyncIterator[bytes] = b"",
                head: bytes | None = None) -> tuple[int, bytes]:
    response = await p.request(method, "127.0.0.1", head or method + b" / HTTP/1.1\r\nhost: a\r\n\r\n", body)
    try:
        data = b"".join([chunk async for chunk in response.iter_body()])
    finally:
        await response.aclose()
    return response.status, data


async def reason_of(coro: Awaitable[Any]) -> str:
    try:
        await coro
    except ValetkeyError as exc:
        return exc.code
    return "ok"


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coro
    return asyncio.run(main())


def test_kept_alive_connections_are_reused() -> None:
    async def case() -> None:
        async with Server(answer(OK, OK, OK)) as srv:
            p = pool(srv.port)
            assert [await fetch(p) for _ in range(3)] == [(200, b"ok")] * 3
            assert srv.connections == 1
            await p.aclose()
    run(case())


@pytest.mark.parametrize(("method", "body", "expected", "requests_seen"), [
    pytest.param(b"GET", b"", "ok", 2, id="get-is-retried"),
    pytest.param(b"PUT", b"{}", "ok", 2, id="put-is-idempotent"),
    pytest.param(b"POST", b"{}", "upstream_protocol_error", 1, id="post-is-never-repeated"),
])
def test_a_kept_alive_connection_closed_unanswered(method: bytes, body: bytes, expected: str,
                                                   requests_seen: int) -> None:
    """The upstream takes the next request on a kept-alive connection, then closes it without an
    answer (the keep-alive race): safe methods are retried once on a fresh connection."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, srv: Server) -> None:
        await srv.read_request(reader)
        if srv.connections == 1:
            writer.write(OK)
            await writer.drain()
            await srv.read_request(reader)
            return  # closes without answering
        writer.write(OK)
        await writer.drain()
        await reader.read()

    async def case() -> None:
        async with Server(script) as srv:
            p = pool(srv.port)
            head = method + b" / HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n" % len(body)
            assert await fetch(p, method, body, head) == (200, b"ok")
            assert await reason_of(fetch(p, method, body, head)) == expected
            assert len(srv.requests) == 1 + requests_seen
            await p.aclose()
    run(case())


def test_an_idle_connection_the_upstream_closed_is_not_used() -> None:
    async def case() -> None:
        async with Server(answer(OK, close=True)) as srv:
            p = pool(srv.port)
            assert await fetch(p) == (200, b"ok")
            await asyncio.sleep(0.05)  # the event loop sees the close
            assert await fetch(p) == (200, b"ok")
            assert srv.connections == 2
            await p.aclose()
    run(case())


@pytest.mark.parametrize(("method", "response", "expected"), [
    pytest.param(b"HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", (200, b""), id="head-has-no-body"),
    pytest.param(b"GET", b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK, (200, b"ok"), id="1xx-skipped"),
    pytest.param(b"GET", b"HTTP/1.1 204 No Content\r\n\r\n", (204, b""), id="204"),
    pytest.param(b"GET", b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil close", (200, b"until close"),
                 id="close-delimited"),
    pytest.param(b"GET", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
                 (200, b"abc"), id="chunked"),
    pytest.param(b"GET", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n"
                 b"Set-Cookie: evil=1\r\n\r\n", (200, b"ab"), id="trailers-dropped"),
])
def test_response_framing(method: bytes, response: bytes, expected: tuple[int, bytes]) -> None:
    async def case() -> None:
        async with Server(answer(response, close=True)) as srv:
            p = pool(srv.port)
            answer_ = await p.request(method, "127.0.0.1", method + b" / HTTP/1.1\r\nhost: a\r\n\r\n", b"")
            body = b"".join([chunk async for chunk in answer_.iter_body()])
            await answer_.aclose()
            assert (answer_.status, body) == expected
            assert not any(name.lower() == b"set-cookie" for name, _ in answer_.headers)  # no trailer
            await p.aclose()
    run(case())


def test_bytes_after_a_response_cost_the_connection() -> None:
    """An upstream that answers twice is out of step: the first answer stands, the connection
    is never reused (another run's request could read the stale bytes)."""
    async def case() -> None:
        async with Server(answer(OK + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTALE", OK)) as srv:
            p = pool(srv.port)
            assert await fetch(p) == (200, b"ok")
            await asyncio.sleep(0.05)
            assert await fetch(p) == (200, b"ok")
            assert srv.connections == 2
            await p.aclose()
    run(case())


def test_a_reset_is_not_the_end_of_a_close_delimited_body() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, srv: Server) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npartial-body")
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN

    async def case() -> None:
        async with Server(script) as srv:
            p = pool(srv.port)
            assert await reason_of(fetch(p)) == "upstream_protocol_error"
            await p.aclose()
    run(case())


@pytest.mark.parametrize(("response", "read", "expected"), [
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", 2.0, "upstream_protocol_error",
                 id="truncated-body"),
    pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", 2.0, "upstream_protocol_error",
                 id="truncated-chunked"),
    pytest.param(b"SSH-2.0-OpenSSH_9.2\r\n", 2.0, "upstream_protocol_error", id="not-http"),
    pytest.param(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n", 2.0,
                 "upstream_protocol_error", id="upgrade"),
    pytest.param(b"", 2.0, "upstream_protocol_error", id="closed-unanswered"),
    pytest.param(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: p\r\n" * 50_000 + b"\r\n", 2.0, "upstream_protocol_error",
                 id="head-too-large"),
    pytest.param(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 600_000, 2.0, "upstream_protocol_error",
                 id="header-never-ends"),
    pytest.param(None, 0.3, "upstream_timeout", id="no-answer"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nstall", 0.3, "upstream_timeout", id="stall"),
])
def test_broken_upstreams_give_reason_codes(response: bytes | None, read: float, expected: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, srv: Server) -> None:
        await srv.read_request(reader)
        if response is None:
            await asyncio.sleep(2)
            return
        writer.write(response)
        await writer.drain()
        if b"stall" in response:
            await asyncio.sleep(2)

    async def case() -> None:
        async with Server(script) as srv:
            p = pool(srv.port, read=read)
            assert await reason_of(fetch(p)) == expected
            await p.aclose()
    run(case())


def test_refused_connection_is_unreachable() -> None:
    async def case() -> None:
        async with Server(answer(OK)) as srv:
            port = srv.port
        p = pool(port)
        assert await reason_of(fetch(p)) == "upstream_unreachable"
    run(case())


def test_streamed_upload_goes_chunked() -> None:
    async def parts() -> AsyncIterator[bytes]:
        for part in (b"one ", b"", b"two"):
            yield part

    async def case() -> None:
        async with Server(answer(OK)) as srv:
            client = UpstreamClient(upstream_at(srv.port), connect=2, read=2)
            response = await client.open("POST", "127.0.0.1", b"/up", [(b"x-a", b"1")], parts())
            await response.aclose()
            seen = srv.requests[0]
            assert seen.startswith(b"POST /up HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % srv.port)
            assert b"transfer-encoding: chunked" in seen
            assert seen.endswith(b"one two")
            await client.aclose()
    run(case())


@pytest.mark.parametrize("headers", [
    pytest.param([(b"x-a", b"1\r\nx-injected: 1")], id="crlf-in-value"),
    pytest.param([(b"x-a", b"1\nx-injected: 1")], id="lf-in-value"),
    pytest.param([(b"x-a\r\nx-b", b"1")], id="crlf-in-name"),
    pytest.param([(b"x-a", b"1\x00")], id="nul"),
])
def test_line_breaks_never_reach_the_upstream(headers: list[tuple[bytes, bytes]]) -> None:
    async def case() -> None:
        async with Server(answer(OK)) as srv:
            client = UpstreamClient(upstream_at(srv.port), connect=2, read=2)
            assert await reason_of(client.open("GET", "127.0.0.1", b"/", headers, b"")) == "invalid_request"
            assert srv.connections == 0
            await client.aclose()
    run(case())


def test_a_slow_reader_stops_the_upstream_socket_being_read() -> None:
    """Back-pressure: the gateway buffers a bounded amount of a response its client is not reading."""
    big = b"x" * (8 * 1024 * 1024)

    async def case() -> None:
        async with Server(answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big)) as srv:
            p = pool(srv.port)
            response = await p.request(b"GET", "127.0.0.1", b"GET / HTTP/1.1\r\nhost: a\r\n\r\n", b"")
            body = response.iter_body()
            received = len(await anext(body))
            await asyncio.sleep(0.3)
            conn = response._conn
            assert conn._buffered <= HIGH_WATER + 512 * 1024
            async for chunk in body:
                received += len(chunk)
            assert received == len(big)
            await response.aclose()
            await p.aclose()
    run(case())


def test_writes_of_one_loop_turn_leave_together() -> None:
    """The gateway server's CorkedWrites: a response's status line, headers, body and terminator
    written in one turn of the event loop reach the socket as one write; a close flushes first."""
    from gateways.server import CorkedWrites

    class Recording(asyncio.Transport):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[bytes] = []
            self.closed = False

        def write(self, data: bytes | bytearray | memoryview) -> None:
            self.writes.append(bytes(data))

        def is_closing(self) -> bool:
            return self.closed

        def close(self) -> None:
            self.closed = True

    async def case() -> None:
        transport = Recording()
        corked = CorkedWrites(transport)
        for part in (b"HTTP/1.1 200 OK\r\n\r\n", b"2\r\nok\r\n", b"0\r\n\r\n"):
            corked.write(part)
        assert transport.writes == []
        await asyncio.sleep(0)
        assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n2\r\nok\r\n0\r\n\r\n"]
        corked.write(b"last")
        corked.close()
        assert transport.writes[-1] == b"last"
        assert transport.closed
    run(case())
