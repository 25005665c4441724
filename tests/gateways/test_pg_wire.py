"""The Postgres gateway's protocol pieces without a database: framing limits, statement types for
the audit line, and where a password may be asked for."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from contract.errors import Forbidden, Reason
from gateways import pg_wire as wire
from gateways.pg_session import PgSession


def _read(data: bytes) -> wire.Startup:
    async def go() -> wire.Startup:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await wire.read_startup(reader)

    return asyncio.run(go())


@pytest.mark.parametrize(("text", "kind"), [
    pytest.param(b"SELECT 1", "SELECT", id="select"),
    pytest.param(b"  /* x */ -- y\n insert into t values (1)", "INSERT", id="comments-first"),
    pytest.param(b"with x as (select 1) delete from t", "WITH", id="with"),
    pytest.param(b"", "EMPTY", id="empty"),
    pytest.param(b"'; DROP TABLE x", "EMPTY", id="no-keyword"),
    pytest.param(b"A" * 100, "A" * 16, id="long-keyword-cut"),
])
def test_statement_type(text: bytes, kind: str) -> None:
    assert wire.statement_type(text) == kind


@pytest.mark.parametrize(("packet", "problem"), [
    pytest.param(struct.pack("!ii", 4, wire.PROTOCOL_3), "start-up packet of 4 bytes", id="too-short"),
    pytest.param(struct.pack("!ii", 20_000, wire.PROTOCOL_3), "20000 bytes", id="too-long"),
    pytest.param(struct.pack("!ii", 8, 2 << 16), "protocol 2.0", id="protocol-2"),
    pytest.param(struct.pack("!ii", 12, wire.PROTOCOL_3) + b"user", "not terminated", id="unterminated"),
    pytest.param(struct.pack("!ii", 23, wire.PROTOCOL_3) + b"user\0a\0user\0b\0\0", "repeated",
                 id="repeated-param"),
    pytest.param(struct.pack("!ii", 12, wire.SSL_REQUEST) + b"xxxx", "with a body", id="ssl-with-body"),
])
def test_malformed_startup_packets(packet: bytes, problem: str) -> None:
    with pytest.raises(wire.WireError) as caught:
        _read(packet)
    assert problem in str(caught.value)


def test_startup_parameters() -> None:
    packet = wire.startup_packet({"user": "run_x", "database": "app", "application_name": "psql"})
    startup = _read(packet)
    assert startup.code == wire.PROTOCOL_3
    assert startup.params == {"user": "run_x", "database": "app", "application_name": "psql"}


class _Writer:
    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer
        self.written = b""

    def get_extra_info(self, name: str) -> Any:
        return self.peer if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.written += data


class _Gateway:
    upstream = type("U", (), {"name": "appdb"})()


@pytest.mark.parametrize("peer", [("10.1.2.3", 5000), ("192.168.0.9", 5000), ("2001:db8::1", 5000)])
def test_no_password_is_asked_for_in_the_clear_from_another_host(peer: tuple[str, int]) -> None:
    writer = _Writer(peer)

    async def go() -> None:
        session = PgSession(_Gateway(), asyncio.StreamReader(), writer)  # type: ignore[arg-type]
        await session._authenticate({"user": "run_x", "database": "app"})

    with pytest.raises(Forbidden) as caught:
        asyncio.run(go())
    assert caught.value.reason is Reason.TLS_REQUIRED
    assert writer.written == b""  # refused before AuthenticationCleartextPassword


def test_a_loopback_peer_is_asked_for_the_password() -> None:
    writer = _Writer(("127.0.0.1", 5000))

    async def go() -> None:
        reader = asyncio.StreamReader()
        reader.feed_eof()
        session = PgSession(_Gateway(), reader, writer)  # type: ignore[arg-type]
        session.writer.drain = _drained  # type: ignore[attr-defined]
        await session._authenticate({"user": "run_x"})

    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(go())
    assert writer.written == wire.auth(wire.AUTH_CLEARTEXT)


async def _drained() -> None:
    return None
