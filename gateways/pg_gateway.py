"""The Postgres gateway: ``valetkey gateway serve --upstream NAME`` for an upstream of
``protocol: postgres``. Its state, built once and started at start-up, and its TCP server.

``start`` logs in to Vault (AppRole, or ``VAULT_TOKEN`` in development), resolves and pins the
database address (the egress guard as for HTTP upstreams), loads the JWKS and the revocations:
a gateway that cannot do all of it does not start. Sessions then touch memory and Redis (budgets,
audit); Vault only for a run's first session (its lease) and in the background (renewals).

Settings beyond the HTTP gateway's (``gateways/settings.py``):
``VALETKEY_PG_TLS_CERT_FILE`` / ``VALETKEY_PG_TLS_KEY_FILE``: the certificate the gateway shows
clients that ask for TLS. Without it, clients connect with ``sslmode=disable`` and only loopback
peers may log in (the password is a run token: it never crosses a network in the clear).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis
from prometheus_client import start_http_server

from contract.env import SettingsError
from contract.errors import Reason
from contract.jwks import KeyCache, http_fetcher
from contract.secret import Secret
from contract.tasks import stop_task
from contract.vault import VaultClient
from contract.verify import TokenVerifier
from gateways import pg_upstream
from gateways import pg_wire as wire
from gateways.audit import AuditSink, Metrics
from gateways.budget import Budgets
from gateways.egress import PinnedResolver, Resolver
from gateways.gateway import REDIS_POOL_WAIT
from gateways.pg_session import PgSession
from gateways.revocation_watcher import RevocationWatcher
from gateways.runslots import RunSlots
from gateways.settings import GatewaySettings
from gateways.sources.cache import RunCredentials
from gateways.sources.issued import IssuedValues
from gateways.sources.metrics import SourceMetrics
from gateways.sources.prewarm import Prewarm
from gateways.sources.vault_database import VaultDatabase
from policies.model import PostgresTarget, Upstream
from policies.sources import VaultDatabaseSource

log = logging.getLogger("valetkey.gateway")
RELOGIN_MIN = 5.0


def client_tls(env: Mapping[str, str]) -> ssl.SSLContext | None:
    cert, key = env.get("VALETKEY_PG_TLS_CERT_FILE", ""), env.get("VALETKEY_PG_TLS_KEY_FILE", "")
    if not cert and not key:
        return None
    if not (cert and key and os.path.isfile(cert) and os.path.isfile(key)):
        raise SettingsError("VALETKEY_PG_TLS_CERT_FILE and VALETKEY_PG_TLS_KEY_FILE: set both, to files")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


async def _no_forms(values: tuple[Secret, ...]) -> None:
    """PostgreSQL never sends the password back and results are not parsed: nothing to redact."""
    return None


@dataclass
class PgGateway:
    settings: GatewaySettings
    upstream: Upstream
    target: PostgresTarget
    vault: VaultClient
    redis: aioredis.Redis
    http: httpx.AsyncClient
    keys: KeyCache
    verifier: TokenVerifier
    revocations: RevocationWatcher
    resolver: PinnedResolver
    leases: RunCredentials[None]  # each run's lease (no redaction forms: see docs/threat-model.md)
    prewarm: Prewarm  # a run's lease is issued when the broker creates the run
    issued: IssuedValues  # the passwords' digests, published: HTTP gateways refuse them as passthrough
    audit: AuditSink
    metrics: Metrics
    budgets: Budgets
    slots: RunSlots
    client_tls: ssl.SSLContext | None
    upstream_tls: ssl.SSLContext | None
    cancel_keys: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    connections: int = 0
    _server: asyncio.Server | None = field(default=None, repr=False)
    _login_task: asyncio.Task[None] | None = field(default=None, repr=False)
    _metrics_server: tuple[Any, Any] | None = field(default=None, repr=False)

    @classmethod
    def build(cls, settings: GatewaySettings, upstream: Upstream, *, env: Mapping[str, str] | None = None,
              resolver: Resolver | None = None, lease_tick: float = 1.0) -> PgGateway:
        source = upstream.credential_source
        if upstream.postgres is None or not isinstance(source, VaultDatabaseSource):
            raise SettingsError(f"upstream {upstream.name} is not a postgres upstream with a "
                                "vault_database source")
        vault = VaultClient(settings.vault_addr, settings.vault_token or Secret(""))
        redis = aioredis.Redis.from_pool(aioredis.BlockingConnectionPool.from_url(
            settings.redis_url, max_connections=settings.redis_max_connections, timeout=REDIS_POOL_WAIT,
            socket_timeout=2.0))
        broker_tls: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=settings.broker_ca_file) if settings.broker_ca_file else True)
        http = httpx.AsyncClient(timeout=5.0, trust_env=False, verify=broker_tls)
        keys = KeyCache(http_fetcher(f"{settings.broker_url}/.well-known/jwks.json", http),
                        max_age=settings.jwks_max_age, max_stale=settings.jwks_max_stale)
        revocations = RevocationWatcher(redis, max_stale=settings.revocation_max_stale)
        metrics = Metrics()
        issued = IssuedValues(redis)
        leases: RunCredentials[None] = RunCredentials(
            VaultDatabase(vault, source.mount, dict(source.roles)), upstream.name,
            SourceMetrics(metrics.registry), _no_forms, tick=lease_tick, issued=issued)
        leases.revoked = revocations.revoked  # the sweep ends runs a revocation covers
        revocations.listeners.append(lambda record: leases.end_runs(record.covers))  # and at once
        return cls(
            settings=settings, upstream=upstream, target=upstream.postgres, vault=vault, redis=redis,
            http=http, keys=keys, revocations=revocations,
            verifier=TokenVerifier(issuer=settings.issuer, audience=upstream.name, keys=keys,
                                   run_check=revocations.run_check, leeway=settings.token_leeway),
            resolver=PinnedResolver(upstream.postgres.host, upstream.postgres.port, upstream.allow_private,
                                    resolver=resolver),
            leases=leases, prewarm=Prewarm(redis, leases, upstream.name), issued=issued,
            audit=AuditSink(redis, settings.audit_stream, settings.audit_maxlen, metrics,
                            settings.audit_buffer),
            metrics=metrics, budgets=Budgets(redis, upstream, since=revocations.generation_since),
            slots=RunSlots(upstream.run_limits.concurrent),
            client_tls=client_tls(os.environ if env is None else env),
            upstream_tls=pg_upstream.tls_context(upstream.postgres, settings.upstream_ca_file),
        )

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self.settings.port
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def new_cancel_key(self, backend: tuple[int, int]) -> tuple[int, int]:
        """Our own (pid, secret key) for a session: the database's never reach the sandbox."""
        key = (secrets.randbits(31), secrets.randbits(31))
        self.cancel_keys[key] = backend
        return key

    async def cancel(self, key: tuple[int, int]) -> None:
        backend = self.cancel_keys.get(key)
        if backend is not None:
            await pg_upstream.cancel(self.resolver.current(), backend, self.settings.connect_timeout)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= self.settings.max_connections:
            writer.write(wire.error_response(wire.TOO_MANY_CONNECTIONS,
                                             f"valetkey: {Reason.CONNECTION_LIMIT.value}: too many sessions"))
            writer.close()
            return
        self.connections += 1
        try:
            await PgSession(self, reader, writer).run()
        finally:
            self.connections -= 1

    async def _login(self) -> float:
        """AppRole login (production); returns seconds until the next one. A plain token: never."""
        settings = self.settings
        if not settings.approle_role_id or settings.approle_secret_id is None:
            return float("inf")
        token, lease = await self.vault.approle_login(settings.approle_role_id, settings.approle_secret_id)
        self.vault.set_token(token)
        return max(RELOGIN_MIN, lease * 2 / 3) if lease else float("inf")

    async def _relogin(self, wait: float) -> None:
        while wait != float("inf"):
            await asyncio.sleep(wait)
            try:
                wait = await self._login()
            except Exception as exc:
                log.warning('{"event": "vault_login_failed", "error": "%s"}', type(exc).__name__)
                wait = RELOGIN_MIN

    async def start(self) -> None:
        self._login_task = asyncio.create_task(self._relogin(await self._login()), name="pg-vault-login")
        await self.revocations.start()
        await self.resolver.start()
        await self.keys.start()
        await self.audit.start()
        await self.issued.start()
        await self.leases.start()
        await self.prewarm.start()
        if self.settings.metrics_listen is not None:
            host, port = self.settings.metrics_listen
            self._metrics_server = start_http_server(port, addr=host, registry=self.metrics.registry)
        self._server = await asyncio.start_server(self._handle, self.settings.host, self.settings.port)
        log.info('{"event": "gateway_started", "upstream": "%s", "protocol": "postgres", "port": %d}',
                 self.upstream.name, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._server.wait_closed()
        if self._metrics_server is not None:
            server, thread = self._metrics_server
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        await self.budgets.close()
        await self.prewarm.stop()
        await self.leases.stop()
        await self.issued.stop()
        await stop_task(self._login_task)
        await self.audit.stop()
        await self.revocations.stop()
        await self.resolver.stop()
        await self.keys.stop()
        await self.http.aclose()
        await self.vault.aclose()
        await self.redis.aclose()


async def serve(settings: GatewaySettings, upstream: Upstream) -> None:
    """Run until cancelled (Ctrl-C / SIGTERM through asyncio.run)."""
    gateway = PgGateway.build(settings, upstream)
    await gateway.start()
    try:
        await asyncio.Event().wait()
    finally:
        await gateway.stop()
