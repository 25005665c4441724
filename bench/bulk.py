"""Bulk transfer for table 7: how fast bytes cross a tunnel (CONNECT, then TLS end to end).

    python -m bench.bulk PORT CERT KEY      the server: ``GET /bulk?bytes=N`` answers N bytes

Both ends are blocking sockets with OpenSSL doing the work (1 MiB writes, 1 MiB reads), so they
run at memory speed and the figure is the proxy's (the client closes first, once it has every
byte: a proxy's teardown when the server closes is not part of the figure); the *direct* row (no
proxy) is the ceiling the same two ends reach on this machine, and it is reported beside every proxy.
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


class _Handler(socketserver.BaseRequestHandler):
    context: ssl.SSLContext

    def handle(self) -> None:
        try:
            conn = self.context.wrap_socket(self.request, server_side=True)
        except (OSError, ssl.SSLError):
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


def fetch(host: str, port: int, *, authority: str, sni: str, ca: str, size: int,
          proxy_auth: str | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """Download ``size`` bytes from the bulk server at ``authority``: dialled at host:port, through
    CONNECT when ``proxy_auth`` is given. MB/s counts from the request to the last byte."""
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        if proxy_auth is not None:
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
        context = ssl.create_default_context(cafile=ca)
        conn = context.wrap_socket(raw, server_hostname=sni)
    except BaseException:
        raw.close()
        raise
    with conn:
        started = time.perf_counter()
        conn.sendall(f"GET /bulk?bytes={size} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        got, head = 0, b""
        while b"\r\n\r\n" not in head:
            n = conn.recv_into(view)
            if not n:
                raise ConnectionError("the bulk server closed before its answer")
            head += bytes(view[:n])
        head, _, rest = head.partition(b"\r\n\r\n")
        got = len(rest)
        while got < size:
            n = conn.recv_into(view)
            if not n:
                break
            got += n
        seconds = time.perf_counter() - started
    if got < size:
        raise ConnectionError(f"bulk transfer ended after {got} of {size} bytes")
    return {"bytes": got, "seconds": round(seconds, 4), "mb_per_s": round(got / seconds / 1e6, 1)}


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3])
