"""A raw proxy client for refusal tests: exact control over CONNECT, Proxy-Authorization, the
ClientHello (SNI or none) and the request inside a terminated tunnel.

    answer, sock = connect(proxy, "api.openai.com:443", token)
    answer.status, answer.reason, answer.header("proxy-authenticate")
    handshake(sock, sni="api.openai.com", cafile=...)   # TlsOutcome: ok, or the error it ended in
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

TIMEOUT = 10.0
MAX_HEAD = 64 * 1024


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name.lower()]

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def reason(self) -> str:
        """The ``error`` of a valetkey JSON error body ('' when there is none)."""
        try:
            value = self.json()
        except ValueError:
            return ""
        return str(value.get("error", "")) if isinstance(value, dict) else ""


def basic(token: str, user: str = "run") -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def _read_head(sock: socket.socket | ssl.SSLSocket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"connection closed before a complete response head: {data[:200]!r}")
        data += chunk
        if len(data) > MAX_HEAD:
            raise ConnectionError("response head too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def read_answer(sock: socket.socket | ssl.SSLSocket, tunnel: bool = False) -> Answer:
    """One HTTP/1.1 response with its body by Content-Length (or to EOF) — none when ``tunnel``
    and the status is 2xx (an established CONNECT)."""
    head, rest = _read_head(sock)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])]
    if tunnel and 200 <= status < 300:
        return Answer(status, headers, rest)
    length = next((int(v) for k, v in headers if k == "content-length"), None)
    while length is None or len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return Answer(status, headers, rest if length is None else rest[:length])


def connect(proxy: tuple[str, int], target: str, token: str | None = None,
            authorization: str | None = None) -> tuple[Answer, socket.socket]:
    """``CONNECT target`` (with ``Proxy-Authorization: Basic run:token`` when given); the socket
    stays open for what follows a ``200``."""
    sock = socket.create_connection(proxy, timeout=TIMEOUT)
    auth = authorization or (basic(token) if token is not None else None)
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if auth is not None:
        lines.append(f"Proxy-Authorization: {auth}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return read_answer(sock, tunnel=True), sock


def absolute_form(proxy: tuple[str, int], url: str, token: str | None = None, method: str = "GET") -> Answer:
    """A plain ``http://`` request in absolute form, as clients send through an HTTP proxy."""
    host = url.split("/", 3)[2]
    lines = [f"{method} {url} HTTP/1.1", f"Host: {host}", "Connection: close"]
    if token is not None:
        lines.append(f"Proxy-Authorization: {basic(token)}")
    with socket.create_connection(proxy, timeout=TIMEOUT) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return read_answer(sock)


@dataclass
class TlsOutcome:
    """A handshake through a tunnel: ``sock`` when it completed, else the error it ended in."""

    sock: ssl.SSLSocket | None
    error: str = ""
    peer_names: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.sock is not None


def handshake(sock: socket.socket, sni: str | None, cafile: str | None = None) -> TlsOutcome:
    """TLS over an established tunnel. ``sni=None`` sends no server_name at all (and so cannot
    check the name); ``cafile=None`` verifies nothing — the refusals under test come first."""
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    if sni is None or cafile is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    try:
        tls = context.wrap_socket(sock, server_hostname=sni)
        # TLS 1.3: a server that refuses after the handshake shows it on the first read
        tls.settimeout(TIMEOUT)
    except (ssl.SSLError, OSError) as exc:
        return TlsOutcome(None, f"{type(exc).__name__}: {exc}")
    return TlsOutcome(tls)


def request(tls: ssl.SSLSocket, method: str, path: str, host: str, headers: dict[str, str] | None = None
            ) -> Answer:
    """One HTTP/1.1 request inside a terminated tunnel (``Connection: close``)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    tls.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return read_answer(tls)
