"""Bulk transfer for table 7: how fast bytes cross a tunnel (CONNECT, then TLS end to end).

    python -m bench.bulk PORT CERT KEY      the server: ``GET /bulk?bytes=N`` answers N bytes

Both ends are blocking sockets with OpenSSL doing the work (1 MiB writes, 1 MiB reads); the
*direct* row (no proxy) is the ceiling the same two ends reach on this machine, reported beside
every proxy (the client closes first, once it has every byte: a proxy's teardown when the server
closes is not part of the figure). On a small machine that ceiling is the ends' own cost (TLS and
a copy at each end, each end a core), so a relay in between can only share their cores.

``fetch_raw`` measures the relay itself: the client sends a real ClientHello for the name (what
a tunnel checks before relaying) offering the ALPN protocol ``RAW_ALPN``, then ``RAW N``; the
server, seeing that protocol in the hello, answers N bytes with no TLS. Every proxy relays the
same bytes; the ends cost a copy each and no crypto.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import ssl
import sys
import time
from typing import Any

CHUNK = 1 << 20
_BLOCK = bytes(range(256)) * (CHUNK // 256)
RAW_ALPN = "valetkey-bench-raw"


def _hello_record(sock: socket.socket) -> bytes | None:
    """The first TLS record (the ClientHello), peeked without consuming it; None if it is not one."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        head = sock.recv(1 << 16, socket.MSG_PEEK)  # blocks until something is queued
        if not head or head[0] != 0x16:
            return None
        if len(head) >= 5 and len(head) >= 5 + int.from_bytes(head[3:5], "big"):
            return head[:5 + int.from_bytes(head[3:5], "big")]
        time.sleep(0.001)  # part of the record: wait for the rest
    return None


def _serve_raw(sock: socket.socket, hello: bytes) -> None:
    """After the hello: ``RAW N\n``, then N bytes, no TLS; then wait for the client to close."""
    sock.recv(len(hello), socket.MSG_WAITALL)
    line = b""
    while not line.endswith(b"\n"):
        data = sock.recv(1)
        if not data:
            return
        line += data
    size = int(line.split()[1])
    view = memoryview(_BLOCK)
    while size > 0:
        sent = min(size, CHUNK)
        sock.sendall(view[:sent])
        size -= sent
    with contextlib.suppress(OSError):
        sock.recv(1)


class _Handler(socketserver.BaseRequestHandler):
    context: ssl.SSLContext

    def handle(self) -> None:
        try:
            hello = _hello_record(self.request)
            if hello is not None and RAW_ALPN.encode() in hello:
                _serve_raw(self.request, hello)
                return
            conn = self.context.wrap_socket(self.request, server_side=True)
        except (OSError, ssl.SSLError, ValueError):
            return
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            target = head.split(b" ", 2)[1].decode("latin-1")
            size = int(target.partition("bytes=")[2] or 0)
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
            view = memoryview(_BLOCK)
            while size > 0:
                sent = min(size, CHUNK)
                conn.sendall(view[:sent])
                size -= sent
            # the client closes first: a proxy's teardown when the server closes is not what this measures
            conn.settimeout(30)
            with contextlib.suppress(OSError):  # the client's close, with or without TLS close_notify
                conn.recv(1)


def serve(port: int, cert: str, key: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    handler = type("Handler", (_Handler,), {"context": context})
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    with socketserver.ThreadingTCPServer(("127.0.0.1", port), handler) as server:
        server.daemon_threads = True
        server.serve_forever()


def _dial(host: str, port: int, authority: str, proxy_auth: str | None, timeout: float) -> socket.socket:
    """A connection to the bulk server: direct, or through CONNECT when ``proxy_auth`` is given."""
    raw = socket.create_connection((host, port), timeout=timeout)
    if proxy_auth is None:
        return raw
    try:
        raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
                    f"Proxy-Authorization: {proxy_auth}\r\n\r\n".encode("latin-1"))
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = raw.recv(1)  # byte by byte: nothing past the proxy's answer may be consumed
            if not data:
                raise ConnectionError("the proxy closed the CONNECT")
            answer += data
        if answer[9:12] != b"200":
            raise ConnectionError(f"CONNECT answered {answer[9:12].decode(errors='replace')}")
    except BaseException:
        raw.close()
        raise
    return raw


def fetch_raw(host: str, port: int, *, authority: str, sni: str, size: int, proxy_auth: str | None = None,
              timeout: float = 120.0) -> dict[str, Any]:
    """The relay's own speed: a real ClientHello for ``sni`` (offering ``RAW_ALPN``), then
    ``size`` bytes back with no TLS at either end. MB/s from the hello to the last byte."""
    context = ssl.create_default_context()
    context.set_alpn_protocols([RAW_ALPN])
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname=sni)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    with _dial(host, port, authority, proxy_auth, timeout) as conn:
        started = time.perf_counter()
        conn.sendall(hello + f"RAW {size}\n".encode())
        return _read_to(conn, memoryview(bytearray(CHUNK)), 0, size, started, "raw transfer")


def fetch(host: str, port: int, *, authority: str, sni: str, ca: str, size: int,
          proxy_auth: str | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """Download ``size`` bytes from the bulk server at ``authority``: dialled at host:port, through
    CONNECT when ``proxy_auth`` is given. MB/s counts from the request to the last byte."""
    raw = _dial(host, port, authority, proxy_auth, timeout)
    try:
        context = ssl.create_default_context(cafile=ca)
        conn = context.wrap_socket(raw, server_hostname=sni)
    except BaseException:
        raw.close()
        raise
    with conn:
        started = time.perf_counter()
        conn.sendall(f"GET /bulk?bytes={size} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        view, head = memoryview(bytearray(CHUNK)), b""
        while b"\r\n\r\n" not in head:
            n = conn.recv_into(view)
            if not n:
                raise ConnectionError("the bulk server closed before its answer")
            head += bytes(view[:n])
        return _read_to(conn, view, len(head.partition(b"\r\n\r\n")[2]), size, started, "bulk transfer")


def _read_to(conn: socket.socket, view: memoryview, got: int, size: int, started: float,
             what: str) -> dict[str, Any]:
    """Read until ``size`` bytes have arrived (``got`` already): the figure from ``started``."""
    while got < size:
        n = conn.recv_into(view)
        if not n:
            raise ConnectionError(f"{what} ended after {got} of {size} bytes")
        got += n
    seconds = time.perf_counter() - started
    return {"bytes": got, "seconds": round(seconds, 4), "mb_per_s": round(got / seconds / 1e6, 1)}


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3])
