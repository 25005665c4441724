"""The kernel relay of tunnels (proxy/splice.py) between real loopback TCP connections: bytes
and counts both ways, half-close, flow control with bounded bytes in flight, a reset side."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from proxy import splice


def test_the_kernel_relay_is_available() -> None:
    """valetkey runs on Linux, which has splice(2): its absence fails here, never skips."""
    assert splice.AVAILABLE


Pair = tuple[socket.socket, socket.socket]  # (the end the test drives, the end the relay holds)


def _tcp_pair() -> Pair:
    with socket.create_server(("127.0.0.1", 0)) as server:
        outer = socket.create_connection(server.getsockname())
        inner, _ = server.accept()
    inner.setblocking(False)
    outer.setblocking(False)
    return outer, inner


@asynccontextmanager
async def relayed() -> AsyncIterator[tuple[socket.socket, socket.socket, splice.Relay, list[int], list[int]]]:
    """(client end, upstream end, relay, sent, received)"""
    client, client_side = _tcp_pair()
    upstream, upstream_side = _tcp_pair()
    sent, received = [0], [0]
    relay = splice.Relay(asyncio.get_running_loop(), client_side, upstream_side, sent, received)
    try:
        yield client, upstream, relay, sent, received
    finally:
        relay.close()
        for sock in (client, upstream, client_side, upstream_side):
            sock.close()


async def _read_all(sock: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < size:
        chunk = await loop.sock_recv(sock, 1 << 20)
        if not chunk:
            break
        got += chunk
    return bytes(got)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_bytes_and_counts_both_ways() -> None:
    up, down = os.urandom(3 << 20), os.urandom(5 << 20)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with relayed() as (client, upstream, relay, sent, received):
            send_up = loop.create_task(loop.sock_sendall(client, up))
            send_down = loop.create_task(loop.sock_sendall(upstream, down))
            assert await _read_all(upstream, len(up)) == up
            assert await _read_all(client, len(down)) == down
            await asyncio.gather(send_up, send_down)
            assert (sent[0], received[0]) == (len(up), len(down))
            assert not relay.done.done()

    run(scenario)


def test_half_close_keeps_the_other_direction() -> None:
    """The client ends its side: the upstream sees the end, and may still answer in full."""
    answer = os.urandom(2 << 20)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with relayed() as (client, upstream, relay, _, received):
            await loop.sock_sendall(client, b"request")
            client.shutdown(socket.SHUT_WR)
            assert await _read_all(upstream, 1 << 20) == b"request"  # ends at the forwarded EOF
            assert not relay.done.done()
            await loop.sock_sendall(upstream, answer)
            upstream.shutdown(socket.SHUT_WR)
            assert await _read_all(client, len(answer) + 1) == answer
            await relay.done  # both directions ended
            assert received[0] == len(answer)

    run(scenario)


def test_a_side_that_does_not_read_stops_the_other() -> None:
    """The client never reads: the relay stops reading the upstream once its pipe and the socket
    buffers are full, so what it holds is bounded whatever the upstream tries to send."""

    async def scenario() -> None:
        async with relayed() as (_, upstream, relay, _, received):
            block = bytes(1 << 20)
            pushed = 0
            for _ in range(256):  # up to 256 MiB, each write as much as the kernel takes now
                try:
                    pushed += upstream.send(block)
                except BlockingIOError:
                    await asyncio.sleep(0.02)
                    try:
                        pushed += upstream.send(block)
                    except BlockingIOError:
                        break
            await asyncio.sleep(0.1)
            assert pushed < 256 << 20, "the upstream was never held back"
            assert received[0] <= pushed
            assert not relay.done.done()

    run(scenario)


def test_a_reset_side_ends_the_relay() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with relayed() as (client, upstream, relay, _, _):
            await loop.sock_sendall(upstream, b"hello")
            assert await loop.sock_recv(client, 10) == b"hello"
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # RST
            await loop.sock_sendall(upstream, b"more" * 1000)
            await relay.done

    run(scenario)


def test_a_splice_that_moves_nothing_before_the_end_cuts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """TCP's splice may move nothing while data is queued (not an end of stream): the relay must
    not take it for one, or the tunnel would be cut short."""
    real, zeros = os.splice, [3]

    def flaky(src: int, dst: int, count: int, *args: int, **kwargs: int) -> int:
        if zeros[0] and stat.S_ISSOCK(os.fstat(src).st_mode):
            zeros[0] -= 1
            return 0
        return real(src, dst, count, *args, **kwargs)

    monkeypatch.setattr(os, "splice", flaky)
    data = os.urandom(1 << 20)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with relayed() as (client, upstream, relay, _, received):
            sending = loop.create_task(loop.sock_sendall(upstream, data))
            assert await _read_all(client, len(data)) == data
            await sending
            assert received[0] == len(data)
            assert not relay.done.done()

    run(scenario)
