"""The PostgreSQL frontend/backend protocol 3.0, as much of it as the gateway speaks: framing,
the start-up packets, authentication messages, ErrorResponse, and reading the statement out of a
Query or Parse message for the audit line (its type and size, never its parameters).

Every length is checked before anything is read or allocated (``MAX_STARTUP``, ``MAX_MESSAGE``);
a malformed packet raises ``WireError``, which the session answers with ``protocol_violation``.
"""

from __future__ import annotations

import asyncio
import re
import struct
from dataclasses import dataclass

PROTOCOL_3 = 196608  # 3.0
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP = 10_000  # as PostgreSQL's own limit on a start-up packet
MAX_MESSAGE = 64 * 1024 * 1024  # one message either way; larger is refused, not buffered
# authentication request codes (the Int32 after 'R')
AUTH_OK, AUTH_CLEARTEXT, AUTH_MD5, AUTH_SASL, AUTH_SASL_CONTINUE, AUTH_SASL_FINAL = 0, 3, 5, 10, 11, 12
# SQLSTATE codes of the refusals we write (https://www.postgresql.org/docs/current/errcodes-appendix.html)
INVALID_PASSWORD = "28P01"  # noqa: S105 - a SQLSTATE, not a password
INVALID_AUTHORIZATION = "28000"
INVALID_CATALOG_NAME = "3D000"
PROTOCOL_VIOLATION = "08P01"
CANNOT_CONNECT = "08006"
ADMIN_SHUTDOWN = "57P01"
TOO_MANY_CONNECTIONS = "53300"
CONFIGURATION_LIMIT = "53400"
FEATURE_NOT_SUPPORTED = "0A000"
_KEYWORD = re.compile(rb"\s*(?:--[^\n]*\n\s*|/\*.*?\*/\s*)*([A-Za-z]+)", re.DOTALL)


class WireError(ValueError):
    """The peer broke the protocol (a bad length, a message we do not accept here)."""


@dataclass(frozen=True)
class Startup:
    """The first packet of a connection: ``code`` is PROTOCOL_3, SSL_REQUEST, GSSENC_REQUEST or
    CANCEL_REQUEST; ``params`` the start-up parameters (protocol 3.0); ``cancel`` (pid, key)."""

    code: int
    params: dict[str, str]
    cancel: tuple[int, int] = (0, 0)


async def read_startup(reader: asyncio.StreamReader) -> Startup:
    head = await reader.readexactly(8)
    length, code = struct.unpack("!ii", head)
    if not 8 <= length <= MAX_STARTUP:
        raise WireError(f"start-up packet of {length} bytes")
    body = await reader.readexactly(length - 8)
    if code in (SSL_REQUEST, GSSENC_REQUEST):
        if body:
            raise WireError("encryption request with a body")
        return Startup(code, {})
    if code == CANCEL_REQUEST:
        if len(body) != 8:
            raise WireError("cancel request of the wrong size")
        pid, key = struct.unpack("!ii", body)
        return Startup(code, {}, (pid, key))
    if code >> 16 != 3:
        raise WireError(f"protocol {code >> 16}.{code & 0xFFFF} is not 3.x")
    if not body.endswith(b"\0"):
        raise WireError("start-up parameters not terminated")
    parts = body[:-1].split(b"\0")
    if len(parts) % 2 == 0 or parts[-1] != b"":  # pairs, then the final empty name
        raise WireError("start-up parameters are not name/value pairs")
    params: dict[str, str] = {}
    for index in range(0, len(parts) - 1, 2):
        name, value = parts[index].decode("utf-8", "replace"), parts[index + 1].decode("utf-8", "replace")
        if not name or name in params:
            raise WireError("an empty or repeated start-up parameter")
        params[name] = value
    return Startup(PROTOCOL_3 if code >> 16 == 3 else code, params)


def startup_packet(params: dict[str, str]) -> bytes:
    body = struct.pack("!i", PROTOCOL_3) + b"".join(
        k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items()) + b"\0"
    return struct.pack("!i", len(body) + 4) + body


async def read_message(reader: asyncio.StreamReader, limit: int = MAX_MESSAGE) -> tuple[bytes, bytes]:
    """One message: (type byte, body). Raises ``IncompleteReadError`` at the end of the stream."""
    head = await reader.readexactly(5)
    kind, length = head[:1], struct.unpack("!i", head[1:])[0]
    if not 4 <= length <= limit:
        raise WireError(f"message {kind!r} of {length} bytes")
    return kind, await reader.readexactly(length - 4)


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def auth(code: int, data: bytes = b"") -> bytes:
    return message(b"R", struct.pack("!i", code) + data)


def auth_code(body: bytes) -> int:
    if len(body) < 4:
        raise WireError("authentication message without a code")
    code: int = struct.unpack("!i", body[:4])[0]
    return code


def error_response(sqlstate: str, text: str, severity: str = "FATAL") -> bytes:
    fields = [(b"S", severity), (b"V", severity), (b"C", sqlstate), (b"M", text)]
    return message(b"E", b"".join(k + v.encode("utf-8") + b"\0" for k, v in fields) + b"\0")


def error_fields(body: bytes) -> dict[str, str]:
    """An ErrorResponse/NoticeResponse body as {field code: text} (for our logs: code and severity)."""
    out: dict[str, str] = {}
    for part in body.split(b"\0"):
        if part:
            out[chr(part[0])] = part[1:].decode("utf-8", "replace")
    return out


def backend_key(pid: int, key: int) -> bytes:
    return message(b"K", struct.pack("!ii", pid, key))


def cancel_packet(pid: int, key: int) -> bytes:
    return struct.pack("!iiii", 16, CANCEL_REQUEST, pid, key)


def cstring(body: bytes, start: int = 0) -> tuple[bytes, int]:
    """The NUL-terminated string at ``start`` and the offset after it."""
    end = body.find(b"\0", start)
    if end < 0:
        raise WireError("string not terminated")
    return body[start:end], end + 1


def statement_text(kind: bytes, body: bytes) -> bytes | None:
    """The SQL text a Query ('Q') or Parse ('P') message carries; None for other messages."""
    if kind == b"Q":
        return cstring(body)[0]
    if kind == b"P":
        _, offset = cstring(body)
        return cstring(body, offset)[0]
    return None


def statement_type(text: bytes) -> str:
    """The first keyword (``SELECT``, ``INSERT``…), upper-case, at most 16 letters; comments
    skipped. Only for the audit line: purposes are enforced by the database's roles, never here."""
    match = _KEYWORD.match(text)
    return match.group(1)[:16].decode("ascii").upper() if match else "EMPTY"
