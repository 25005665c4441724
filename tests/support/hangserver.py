"""A local HTTP server that answers one fixed document, or accepts and never answers.

``mode = "hang"`` models a broker or Vault that is up at the TCP level and hung: connections
are accepted and read, and held open without a byte of answer. ``serve()`` answers again and
drops the held connections (their clients see a reset, as after a restart)."""

from __future__ import annotations

import socket
import threading


class HangableServer:
    def __init__(self, body: bytes, content_type: str = "application/json") -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.body, self.content_type = body, content_type
        self.mode = "serve"
        self.requests = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> HangableServer:
        self._thread.start()
        return self

    def hang(self) -> None:
        self.mode = "hang"

    def serve(self) -> None:
        self.mode = "serve"
        held, self._held = self._held, []
        for conn in held:
            conn.close()

    def stop(self) -> None:
        self.serve()
        self._sock.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    conn.close()
                    return
                head += data
            self.requests += 1
            if self.mode == "hang":
                self._held.append(conn)  # never answered, closed by serve() or stop()
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: %b\r\ncontent-length: %d\r\n"
                         b"connection: close\r\n\r\n%b" % (self.content_type.encode(), len(self.body), self.body))
            conn.close()
        except OSError:
            conn.close()
