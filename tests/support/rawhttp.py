"""A bare HTTP/1.1 upstream for what an ASGI server cannot send: a custom status reason phrase,
trailers after a chunked body, a malformed response. Every request gets ``response`` verbatim."""

from __future__ import annotations

import socket
import threading


class RawUpstream:
    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.response = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> RawUpstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._sock.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                head = b""
                while b"\r\n\r\n" not in head:
                    data = conn.recv(65536)
                    if not data:
                        break
                    head += data
                self.requests.append(head)
                conn.sendall(self.response)
                conn.shutdown(socket.SHUT_WR)
