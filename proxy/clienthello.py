"""Reading the server name out of a TLS ClientHello, before any byte goes upstream (tunnel mode).

    server_name(data) -> Hello      what the first bytes of a tunnel say, once they are enough
    Hello.complete / Hello.sni      ``complete`` False: read more (up to MAX_HELLO bytes)

The ClientHello may be split over several TLS records (RFC 8446 §5.1 allows a handshake message
to span records; a post-quantum key share makes it larger than one TCP segment). Only handshake
records are accepted before it ends. What is checked, and refused as ``client_hello_invalid``:
record type 22 and a 3.x record version, a first handshake message of type 1 (ClientHello), and
every length field inside it agreeing with what contains it. The server_name extension (type 0)
must hold exactly one ``host_name`` entry of DNS characters (RFC 6066 §3); anything else is
invalid, and a ClientHello without the extension has no SNI (``sni_missing`` for the caller).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from contract.errors import BadRequest, Reason

MAX_HELLO = 64 * 1024  # bytes of records read before the ClientHello must have ended
RECORD_HANDSHAKE = 22
HANDSHAKE_CLIENT_HELLO = 1
EXT_SERVER_NAME = 0
_HOST = re.compile(rb"[A-Za-z0-9._-]{1,253}")


@dataclass(frozen=True)
class Hello:
    complete: bool
    sni: str | None = None


def _invalid(detail: str) -> BadRequest:
    return BadRequest(f"not a TLS ClientHello: {detail}", Reason.CLIENT_HELLO_INVALID)


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise _invalid(f"{self.what} ends early")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> _Reader:
        return _Reader(self.take(self.number(length_bytes)), self.what)

    @property
    def done(self) -> bool:
        return self.pos == len(self.data)


def _handshake_bytes(data: bytes) -> tuple[bytes, bool]:
    """The handshake bytes carried by the complete records at the start of ``data``, and whether
    they hold the whole first handshake message."""
    out = bytearray()
    pos = 0
    while pos + 5 <= len(data):
        if data[pos] != RECORD_HANDSHAKE:
            raise _invalid(f"record type {data[pos]} before the ClientHello ended")
        if data[pos + 1] != 3:
            raise _invalid("record version is not TLS")
        length = int.from_bytes(data[pos + 3:pos + 5], "big")
        if length == 0 or length > 16384:
            raise _invalid("record length out of range")
        if pos + 5 + length > len(data):
            break
        out += data[pos + 5:pos + 5 + length]
        pos += 5 + length
        if len(out) >= 4:
            if out[0] != HANDSHAKE_CLIENT_HELLO:
                raise _invalid("the first handshake message is not a ClientHello")
            if len(out) >= 4 + int.from_bytes(out[1:4], "big"):
                return bytes(out), True
    return bytes(out), False


def server_name(data: bytes) -> Hello:
    """Parse what has arrived so far; ``Hello(complete=False)`` asks for more bytes."""
    if data and data[0] != RECORD_HANDSHAKE:
        raise _invalid("the first byte is not a TLS handshake record")
    handshake, complete = _handshake_bytes(data)
    if not complete:
        if len(data) >= MAX_HELLO:
            raise _invalid(f"no complete ClientHello within {MAX_HELLO} bytes")
        return Hello(complete=False)
    message = _Reader(handshake, "ClientHello")
    message.take(1)
    body = message.vector(3)
    body.take(2 + 32)  # legacy_version, random
    body.vector(1)  # legacy_session_id
    suites = body.vector(2)
    if suites.done or len(suites.data) % 2:
        raise _invalid("cipher suites malformed")
    body.vector(1)  # legacy_compression_methods
    if body.done:
        return Hello(complete=True)  # no extensions at all: no SNI
    extensions = body.vector(2)
    if not body.done:
        raise _invalid("bytes after the extensions")
    seen: set[int] = set()
    sni: str | None = None
    while not extensions.done:
        kind = extensions.number(2)
        content = extensions.vector(2)
        if kind in seen:
            raise _invalid(f"extension {kind} twice")  # RFC 8446 §4.2
        seen.add(kind)
        if kind == EXT_SERVER_NAME:
            sni = _host_name(content)
    return Hello(complete=True, sni=sni)


def _host_name(content: _Reader) -> str:
    names = content.vector(2)
    if not content.done:
        raise _invalid("bytes after the server name list")
    name_type = names.number(1)
    host = names.vector(2).data
    if name_type != 0 or not names.done:
        raise _invalid("server_name must hold exactly one host_name")
    if not _HOST.fullmatch(host):
        raise _invalid("server_name is not a DNS name")
    return host.decode("ascii").lower().rstrip(".")
