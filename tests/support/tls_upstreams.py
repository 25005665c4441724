"""Real TLS servers for real-looking names (``api.openai.com``, ``github.com``…) on loopback ports.

Each one is an ASGI app under uvicorn, in a thread, with a certificate for its name from the test
CA (``tests/support/certs.py``). It counts TCP connections at ``accept()`` — before any TLS byte,
so a dial the proxy should never have made is counted even when it sends nothing — and records the
SNI of every handshake. The proxy reaches them through its test-only resolver map
(``VALETKEY_PROXY_TEST_RESOLVE``); nothing edits the machine's hosts file.

    ca = TestCA.create(tmp_path)
    with TlsServer("api.openai.com", app, ca) as server:
        server.port, server.connections, server.sni
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support.certs import make_ca, make_leaf

LOOPBACK = "127.0.0.1"
START_TIMEOUT = 10.0


@dataclass(frozen=True)
class TestCA:
    """The throwaway CA the test upstreams' certificates chain to; ``path`` is its PEM."""

    __test__ = False  # not a pytest test class
    directory: Path
    path: Path
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, directory: Path) -> TestCA:
        directory.mkdir(parents=True, exist_ok=True)
        path, key, cert = make_ca(directory)
        return cls(directory, path, key, cert)

    def server_context(self, hostname: str, sni: list[str | None]) -> ssl.SSLContext:
        """A server context for ``hostname`` (ALPN http/1.1) that appends each handshake's SNI."""
        cert, key = make_leaf(self.directory, self.key, self.cert, hostname)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        context.set_alpn_protocols(["http/1.1"])

        def record(_sock: Any, name: str | None, _context: Any) -> None:
            sni.append(name)

        context.sni_callback = record
        return context


class CountingSocket(socket.socket):
    """A listening socket that counts what it accepts (asyncio's selector loop calls ``accept``)."""

    accepted = 0

    def accept(self) -> tuple[socket.socket, Any]:
        conn, addr = super().accept()
        self.accepted += 1
        return conn, addr


class TlsServer:
    """``app`` served over TLS as ``hostname`` on ``LOOPBACK:port`` (a free port when 0); with
    ``ca=None`` over plain HTTP (what a port-80 destination reaches). ``public_port`` is the port
    clients name (443, or 80 for plain HTTP)."""

    def __init__(self, hostname: str, app: Any, ca: TestCA | None, port: int = 0) -> None:
        self.hostname = hostname
        self.public_port = 443 if ca is not None else 80
        self.app = app
        self.sni: list[str | None] = []
        self._sock = CountingSocket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((LOOPBACK, port))
        self.port: int = self._sock.getsockname()[1]
        # the selector loop (never uvloop): it accepts through CountingSocket.accept
        config = uvicorn.Config(app, host=LOOPBACK, port=self.port, log_level="warning", access_log=False,
                                lifespan="off", http="h11", loop="asyncio", server_header=False)
        config.load()
        if ca is not None:
            config.ssl = ca.server_context(hostname, self.sni)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"tls-{hostname}", daemon=True)
        self._failed: BaseException | None = None

    @property
    def connections(self) -> int:
        """TCP connections accepted so far."""
        return self._sock.accepted

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except BaseException as exc:  # uvicorn exits with SystemExit when it cannot start
            self._failed = exc

    def start(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self.server.started:
            if not self._thread.is_alive() or self._failed is not None or time.monotonic() > deadline:
                raise RuntimeError(f"TLS upstream {self.hostname} did not start on {self.address}: {self._failed!r}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
