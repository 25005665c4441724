"""The Postgres gateway's side of the database: connect to the pinned address, TLS as the policy
says, log in as the run's dynamic user with SCRAM-SHA-256 (``scramp``), and collect what the
server sends until it is ready for the first query.

Only SCRAM-SHA-256 is accepted from the database (no MD5, no cleartext password to it, no
trust): a database that asks for something else is refused ``database_unavailable``. The
password never appears in a message; the database's own error is reduced to its SQLSTATE.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from dataclasses import dataclass, field

from scramp import ScramClient, ScramException

from contract.errors import Reason, Unavailable, UpstreamError
from contract.secret import Secret
from gateways import pg_wire as wire
from gateways.egress import PinnedTarget
from policies.model import PostgresTarget

SCRAM = "SCRAM-SHA-256"


@dataclass
class DatabaseSession:
    """A logged-in connection to the database: ``greeting`` holds the messages the client must
    see before its first query (ParameterStatus… then ReadyForQuery), without BackendKeyData,
    whose real values are in ``backend``."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    backend: tuple[int, int] = (0, 0)
    greeting: list[bytes] = field(default_factory=list)

    def close(self) -> None:
        self.writer.close()


def tls_context(target: PostgresTarget, ca_file: str | None) -> ssl.SSLContext | None:
    if target.tls == "disable":
        return None
    context = ssl.create_default_context(cafile=ca_file)
    if target.tls == "require":  # encrypted, certificate not checked (libpq's sslmode=require)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _refused(body: bytes) -> UpstreamError:
    fields = wire.error_fields(body)
    return UpstreamError(f"the database refused the run's login (SQLSTATE {fields.get('C', '?')})",
                         Reason.DATABASE_UNAVAILABLE, sqlstate=fields.get("C", ""))


async def connect(target: PostgresTarget, pinned: PinnedTarget, user: str, password: Secret,
                  params: dict[str, str], tls: ssl.SSLContext | None, within: float) -> DatabaseSession:
    """Open and log in; raises Unavailable/UpstreamError(database_unavailable)."""
    try:
        async with asyncio.timeout(within):
            reader, writer = await asyncio.open_connection(pinned.address, pinned.port, family=pinned.family)
            session = DatabaseSession(reader, writer)
            try:
                if tls is not None:
                    writer.write(struct.pack("!ii", 8, wire.SSL_REQUEST))
                    answer = await reader.readexactly(1)
                    if answer != b"S":
                        raise UpstreamError("the database does not speak TLS and the policy requires it",
                                            Reason.UPSTREAM_TLS_ERROR)
                    await writer.start_tls(tls, server_hostname=target.host)
                writer.write(wire.startup_packet({**params, "user": user, "database": target.database}))
                await _login(session, user, password)
                await _greeting(session)
            except BaseException:
                writer.close()
                raise
    except TimeoutError:
        raise Unavailable("the database did not answer in time", Reason.UPSTREAM_CONNECT_TIMEOUT) from None
    except ssl.SSLError as exc:
        raise UpstreamError(f"TLS to the database failed: {exc.reason or type(exc).__name__}",
                            Reason.UPSTREAM_TLS_ERROR) from None
    except (OSError, asyncio.IncompleteReadError, wire.WireError) as exc:
        raise Unavailable(f"the database could not be reached: {type(exc).__name__}",
                          Reason.DATABASE_UNAVAILABLE) from None
    return session


async def _login(session: DatabaseSession, user: str, password: Secret) -> None:
    scram: ScramClient | None = None
    while True:
        kind, body = await wire.read_message(session.reader, wire.MAX_STARTUP)
        if kind == b"E":
            raise _refused(body)
        if kind != b"R":
            raise UpstreamError(f"unexpected {kind!r} during the database login",
                                Reason.UPSTREAM_PROTOCOL_ERROR)
        code = wire.auth_code(body)
        try:
            if code == wire.AUTH_OK:
                if scram is None:
                    raise UpstreamError("the database let the run in without a password; "
                                        "configure scram-sha-256 for it", Reason.DATABASE_UNAVAILABLE)
                return
            if code == wire.AUTH_SASL and scram is None:
                mechanisms = [m.decode() for m in body[4:].split(b"\0") if m]
                if SCRAM not in mechanisms:
                    raise UpstreamError("the database offers no SCRAM-SHA-256",
                                        Reason.DATABASE_UNAVAILABLE)
                scram = ScramClient([SCRAM], user, password.reveal())
                first = scram.get_client_first().encode()
                initial = SCRAM.encode() + b"\0" + struct.pack("!i", len(first)) + first
                session.writer.write(wire.message(b"p", initial))
            elif code == wire.AUTH_SASL_CONTINUE and scram is not None:
                scram.set_server_first(body[4:].decode())
                session.writer.write(wire.message(b"p", scram.get_client_final().encode()))
            elif code == wire.AUTH_SASL_FINAL and scram is not None:
                scram.set_server_final(body[4:].decode())  # proves the server knew the password too
            else:
                raise UpstreamError(f"the database asked for authentication method {code}; only "
                                    "SCRAM-SHA-256 is used", Reason.DATABASE_UNAVAILABLE)
        except (ScramException, UnicodeDecodeError):
            raise UpstreamError("SCRAM exchange with the database failed",
                                Reason.DATABASE_UNAVAILABLE) from None


async def _greeting(session: DatabaseSession) -> None:
    while True:
        kind, body = await wire.read_message(session.reader, wire.MAX_STARTUP)
        if kind == b"E":
            raise _refused(body)
        if kind == b"K" and len(body) == 8:
            session.backend = struct.unpack("!ii", body)
            continue
        session.greeting.append(wire.message(kind, body))
        if kind == b"Z":
            return


async def cancel(pinned: PinnedTarget, backend: tuple[int, int], within: float) -> None:
    """Forward a client's cancel request (PostgreSQL answers none; errors are ignored)."""
    try:
        async with asyncio.timeout(within):
            _, writer = await asyncio.open_connection(pinned.address, pinned.port, family=pinned.family)
            writer.write(wire.cancel_packet(*backend))
            await writer.drain()
            writer.close()
    except (OSError, TimeoutError):
        return
