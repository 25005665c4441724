"""One sandbox connection to the Postgres gateway, in the order it runs:

1. **negotiate**: an SSLRequest is answered ``S`` and the connection upgraded when the gateway has
   a certificate (``N`` otherwise), a GSSENCRequest ``N``; a CancelRequest is forwarded to the
   database for the session it names and the connection closed.
2. **startup**: protocol 3.0 with ``user`` = the run id; ``replication`` is refused.
3. **authenticate**: the run token is asked for as a cleartext password (AuthenticationCleartext),
   which is accepted only over TLS or from a loopback peer (``tls_required``); it is verified for
   this gateway's audience (JWKS, revocations in memory), must belong to the run named as user
   (``run_mismatch``), name this upstream's database (``database_not_granted``) and hold exactly
   one purpose (``purpose_ambiguous``); the run's session count is bounded
   (``run_concurrency_exceeded``).
4. **credential**: the run's lease (``gateways/sources/cache.py`` over ``vault_database``: issued
   by Vault on the run's first session, shared by its later ones).
5. **dial**: the pinned database address, TLS as the policy says, SCRAM-SHA-256 as the run's
   database user (``database_unavailable``).
6. **relay**: every client message is framed; a Query or Execute is checked against revocations
   and charged to the run's budgets (``budget_exceeded``) and audited with its statement type and
   size, never its text, parameters or results; the database's answers are copied back as they
   come. A revocation covering the run (``token_revoked``) or the token's expiry (``run_expired``)
   ends the session at once with ErrorResponse 57P01.

Each refusal is an ErrorResponse whose message starts ``valetkey: <reason code>:`` with a SQLSTATE
(28P01 for a token that does not verify, 28000 for one that may not do this, 3D000 another
database, 53300 too many sessions, 53400 over budget, 08P01 protocol, 08006 dependencies), one
audit line, and the connection closed. Nothing here parses SQL to decide anything.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from contract.claims import AccessClaims
from contract.errors import BadRequest, Decision, Forbidden, Reason, Unauthenticated, ValetkeyError
from gateways import pg_upstream
from gateways import pg_wire as wire
from gateways.audit import AuditRecord
from gateways.sources.vault_database import granted_purpose
from policies.model import Purpose

if TYPE_CHECKING:
    from contract.verify import TokenVerifier
    from gateways.audit import AuditSink
    from gateways.budget import Budgets
    from gateways.egress import PinnedResolver
    from gateways.revocation_watcher import RevocationWatcher
    from gateways.runslots import RunSlots
    from gateways.settings import GatewaySettings
    from gateways.sources.cache import RunCredentials
    from policies.model import PostgresTarget, Upstream


class SessionHost(Protocol):
    """What a session uses of its gateway (``gateways.pg_gateway.PgGateway``)."""

    settings: GatewaySettings
    upstream: Upstream
    target: PostgresTarget
    verifier: TokenVerifier
    revocations: RevocationWatcher
    resolver: PinnedResolver
    leases: RunCredentials[None]
    audit: AuditSink
    budgets: Budgets
    slots: RunSlots
    client_tls: ssl.SSLContext | None
    upstream_tls: ssl.SSLContext | None
    cancel_keys: dict[tuple[int, int], tuple[int, int]]

    def new_cancel_key(self, backend: tuple[int, int]) -> tuple[int, int]: ...

    async def cancel(self, key: tuple[int, int]) -> None: ...

# start-up parameters passed on to the database; others (``options``…) are dropped
PASSED_PARAMS = frozenset({"application_name", "client_encoding", "DateStyle", "TimeZone",
                           "extra_float_digits", "IntervalStyle", "search_path"})
READ_CHUNK = 64 * 1024
def _nothing() -> None:
    return None


class SessionEnded(ValetkeyError):
    """The session was ended from outside (revocation, expiry): reason set by whoever ended it."""

    status = 401


_SQLSTATE = {
    Reason.DATABASE_NOT_GRANTED: wire.INVALID_CATALOG_NAME,
    Reason.RUN_CONCURRENCY_EXCEEDED: wire.TOO_MANY_CONNECTIONS,
    Reason.CONNECTION_LIMIT: wire.TOO_MANY_CONNECTIONS,
    Reason.BUDGET_EXCEEDED: wire.CONFIGURATION_LIMIT,
}


def sqlstate(exc: ValetkeyError) -> str:
    if isinstance(exc, SessionEnded):
        return wire.ADMIN_SHUTDOWN
    if exc.reason in _SQLSTATE:
        return _SQLSTATE[exc.reason]
    if exc.status == 401:
        return wire.INVALID_PASSWORD
    if exc.status == 403:
        return wire.INVALID_AUTHORIZATION
    if exc.status == 400:
        return wire.PROTOCOL_VIOLATION
    return wire.CANNOT_CONNECT


def _loopback(peer: object) -> bool:
    try:
        return isinstance(peer, tuple) and ipaddress.ip_address(str(peer[0]).split("%")[0]).is_loopback
    except ValueError:
        return False


class PgSession:
    def __init__(self, gw: SessionHost, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.gw = gw
        self.reader, self.writer = reader, writer
        self.tls = False
        self.record = AuditRecord(request_id=secrets.token_hex(8), upstream=gw.upstream.name,
                                  method="SESSION", path="")
        self.queries = 0
        self._statements: dict[bytes, tuple[str, int]] = {}
        self._portals: dict[bytes, tuple[str, int]] = {}
        self.task: asyncio.Task[Any] | None = None

    async def run(self) -> None:
        started = time.monotonic()
        self.task = asyncio.current_task()
        release: Callable[[], None] = _nothing  # replaced once a slot is held
        key: tuple[int, int] | None = None
        claims: AccessClaims | None = None
        try:
            async with asyncio.timeout(self.gw.settings.header_timeout):
                params = await self._negotiate()
                if params is None:
                    return
                claims, purpose = await self._authenticate(params)
                release = self.gw.slots.acquire(claims.sub)
                lease = await self.gw.leases.get(claims)
                pinned = self.gw.resolver.current()
                db = await pg_upstream.connect(
                    self.gw.target, pinned, lease.credential.username, lease.credential.value,
                    {k: v for k, v in params.items() if k in PASSED_PARAMS}, self.gw.upstream_tls,
                    self.gw.settings.connect_timeout)
            self.record.upstream_addr = f"{pinned.address}:{pinned.port}"
            self.record.credential_kind = lease.credential.kind  # and the lease id: never the password
            self.record.credential_id = lease.credential.id
            key = self.gw.new_cancel_key(db.backend)
            self.writer.write(wire.auth(wire.AUTH_OK) + wire.backend_key(*key) + b"".join(db.greeting))
            self._audit_line("SESSION", f"/{self.gw.target.database}", Decision.ALLOW, Reason.OK)
            await self._relay(db, claims, purpose)
        except ValetkeyError as exc:
            self._refuse(exc)
        except (asyncio.IncompleteReadError, ConnectionError, wire.WireError, TimeoutError,
                ssl.SSLError) as exc:
            reason = Reason.CLIENT_DISCONNECTED
            if isinstance(exc, wire.WireError):
                reason = Reason.PROTOCOL_VIOLATION
            elif isinstance(exc, TimeoutError):
                reason = Reason.REQUEST_HEAD_TIMEOUT
            self._refuse(BadRequest(f"session ended: {type(exc).__name__}", reason))
        finally:
            release()
            if key is not None:
                self.gw.cancel_keys.pop(key, None)
            self._finish(claims, started)

    # 1-2: negotiate and start up -------------------------------------------------------------
    async def _negotiate(self) -> dict[str, str] | None:
        for _ in range(3):  # at most GSSENC, then SSL, then the start-up itself
            startup = await wire.read_startup(self.reader)
            if startup.code == wire.CANCEL_REQUEST:
                await self.gw.cancel(startup.cancel)
                return None
            if startup.code == wire.GSSENC_REQUEST:
                self.writer.write(b"N")
                continue
            if startup.code == wire.SSL_REQUEST:
                if self.tls or self.gw.client_tls is None:
                    self.writer.write(b"N")
                    continue
                self.writer.write(b"S")
                await self.writer.start_tls(self.gw.client_tls)
                self.tls = True
                continue
            if "replication" in startup.params:
                raise BadRequest("replication connections are not served", Reason.PROTOCOL_VIOLATION)
            return startup.params
        raise BadRequest("too many encryption requests", Reason.PROTOCOL_VIOLATION)

    # 3: authenticate -------------------------------------------------------------------------
    async def _authenticate(self, params: dict[str, str]) -> tuple[AccessClaims, Purpose]:
        user = params.get("user", "")
        self.record.run = user[:64]
        if not (self.tls or _loopback(self.writer.get_extra_info("peername"))):
            raise Forbidden("connect with TLS (sslmode=require or verify-full): the password is the "
                            "run token", Reason.TLS_REQUIRED)
        self.writer.write(wire.auth(wire.AUTH_CLEARTEXT))
        await self.writer.drain()
        kind, body = await wire.read_message(self.reader, wire.MAX_STARTUP)
        if kind != b"p":
            raise BadRequest(f"expected a password message, got {kind!r}", Reason.PROTOCOL_VIOLATION)
        token = wire.cstring(body)[0].decode("utf-8", "replace")
        if not token:
            raise Unauthenticated("no password: set PGPASSWORD to the run token", Reason.MISSING_TOKEN)
        try:
            claims = await self.gw.verifier.verify(token)
        except ValetkeyError as exc:
            signed = getattr(exc, "claims", None)
            if isinstance(signed, AccessClaims):
                self.record.runtime = signed.client_id
            raise
        self.record.run, self.record.runtime = claims.sub, claims.client_id
        if claims.exp <= time.time():  # within the verifier's leeway: no session to start
            raise Unauthenticated("the run's token has expired", Reason.RUN_EXPIRED)
        if user != claims.sub:
            raise Forbidden("the user name must be the token's run id (PGUSER from the bundle)",
                            Reason.RUN_MISMATCH)
        database = params.get("database") or user
        if database != self.gw.target.database:
            raise Forbidden(f"this gateway serves database {self.gw.target.database} only",
                            Reason.DATABASE_NOT_GRANTED)
        name = granted_purpose(claims)
        self.record.purpose = name
        purpose = self.gw.upstream.purposes.get(name)
        if purpose is None:
            raise Forbidden(f"no purpose {name} at this upstream", Reason.PURPOSE_NOT_GRANTED)
        return claims, purpose

    # 6: relay --------------------------------------------------------------------------------
    async def _relay(self, db: pg_upstream.DatabaseSession, claims: AccessClaims, purpose: Purpose) -> None:
        """Until either side hangs up, the run is revoked (the revocation watcher cancels this
        task: ``token_revoked``) or its token expires (``run_expired``)."""
        task = self.task
        untrack = self.gw.revocations.track(claims)
        pumps = [asyncio.create_task(self._client_to_db(db, claims, purpose), name="pg-client"),
                 asyncio.create_task(self._db_to_client(db), name="pg-db")]
        try:
            done, _ = await asyncio.wait(pumps, timeout=max(0.0, claims.exp - time.time()),
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise SessionEnded("the run's token expired", Reason.RUN_EXPIRED)
            for pump in done:
                error = pump.exception()
                gone = (ConnectionError, asyncio.IncompleteReadError)  # either side hung up: the end
                if error is not None and not isinstance(error, gone):
                    raise error
        except asyncio.CancelledError:
            if task is None or task.uncancel() > 0 or self.gw.revocations.state.find(claims) is None:
                raise  # not a revocation (the gateway is stopping): let it through
            raise SessionEnded("the run was revoked or ended", Reason.TOKEN_REVOKED) from None
        finally:
            untrack()
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            db.close()

    async def _client_to_db(self, db: pg_upstream.DatabaseSession, claims: AccessClaims,
                            purpose: Purpose) -> None:
        while True:
            kind, body = await wire.read_message(self.reader)
            self.record.bytes_in += len(body) + 5
            if kind == b"P":
                name, _ = wire.cstring(body)
                text = wire.statement_text(kind, body) or b""
                self._statements[name] = (wire.statement_type(text), len(text))
            elif kind == b"B":
                portal, offset = wire.cstring(body)
                self._portals[portal] = self._statements.get(wire.cstring(body, offset)[0], ("UNKNOWN", 0))
            elif kind in (b"Q", b"E"):
                self.gw.revocations.check(claims)
                await self.gw.budgets.charge(claims, purpose, time.time())
                if kind == b"Q":
                    text = wire.statement_text(kind, body) or b""
                    statement = (wire.statement_type(text), len(text))
                else:
                    statement = self._portals.get(wire.cstring(body)[0], ("UNKNOWN", 0))
                self.queries += 1
                self._audit_line("QUERY", statement[0], Decision.ALLOW, Reason.OK, size=statement[1])
            db.writer.write(wire.message(kind, body))
            await db.writer.drain()
            if kind == b"X":
                return

    async def _db_to_client(self, db: pg_upstream.DatabaseSession) -> None:
        while True:
            data = await db.reader.read(READ_CHUNK)
            if not data:
                return
            self.record.bytes_out += len(data)
            self.writer.write(data)
            await self.writer.drain()

    # refusals and the audit ------------------------------------------------------------------
    def _refuse(self, exc: ValetkeyError) -> None:
        self.record.decision, self.record.reason = Decision.of(exc), exc.code
        if exc.reason is not Reason.CLIENT_DISCONNECTED and not self.writer.is_closing():
            self.writer.write(wire.error_response(sqlstate(exc), f"valetkey: {exc.code}: {exc.detail}"))

    def _audit_line(self, method: str, path: str, decision: Decision, reason: Reason, size: int = 0) -> None:
        line = AuditRecord(request_id=self.record.request_id, upstream=self.record.upstream, method=method,
                           path=path, run=self.record.run, runtime=self.record.runtime,
                           purpose=self.record.purpose, decision=decision, reason=reason.value,
                           bytes_in=size, upstream_addr=self.record.upstream_addr,
                           credential_kind=self.record.credential_kind,
                           credential_id=self.record.credential_id)
        self.gw.audit.write(line)

    def _finish(self, claims: AccessClaims | None, started: float) -> None:
        record = self.record
        # a session that reached the database ends with SESSION_END; a refused one is one SESSION line
        record.method = "SESSION_END" if record.upstream_addr else "SESSION"
        if not record.reason:
            record.decision, record.reason = Decision.ALLOW, Reason.OK.value
        record.path = f"/{self.gw.target.database}"
        record.status = self.queries
        record.duration_ms = round((time.monotonic() - started) * 1000, 3)
        self.gw.audit.write(record, claims.exp if claims else 0)
        if not self.writer.is_closing():
            self.writer.close()
