"""One gateway's state: everything its pipeline uses, built once and started at start-up.

``start`` logs in to Vault and reads the secret, resolves and pins the upstream address, loads
the JWKS from the broker: a gateway that cannot do all three does not start. After that the
request path touches only memory and Redis (run state, through one bounded pool); Vault, the
JWKS and the upstream address are refreshed in the background.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis
from prometheus_client import start_http_server

from contract import redis_url
from contract.jwks import KeyCache, http_fetcher
from contract.secret import Secret
from contract.vault import VaultClient
from contract.verify import TokenVerifier
from gateways import overload
from gateways.approval_waiter import ApprovalWaiter
from gateways.audit import AuditSink, Metrics
from gateways.budget import Budgets
from gateways.credential_scan import CredentialScanner
from gateways.detectors import Detectors, WebhookSender
from gateways.egress import PinnedResolver, Resolver
from gateways.redact import Redactor
from gateways.revocation_watcher import RevocationWatcher
from gateways.runslots import RunSlots
from gateways.secret_store import SecretStore
from gateways.settings import GatewaySettings
from gateways.sources import build_source
from gateways.sources.cache import RunCredentials
from gateways.sources.issued import IssuedValues
from gateways.sources.metrics import SourceMetrics
from gateways.sources.prewarm import Prewarm
from gateways.upstream import UpstreamClient
from policies.model import Alerting, Enterprise, Injection, Placement, Upstream

REDIS_POOL_WAIT = 2.0  # seconds a request waits for a free Redis connection before redis_unavailable

# httpx logs each request URL at INFO and httpcore more at DEBUG; a webhook URL can itself be a
# credential (Slack-style), so these loggers never go below WARNING in a valetkey process.
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def injected_forms(injection: Injection, secret: bytes) -> list[bytes]:
    """What the injection itself put on the wire (e.g. ``Bearer <secret>``, the Basic value)."""
    import base64

    if injection.placement is Placement.HEADER:
        return [injection.format.replace("{secret}", secret.decode("latin-1")).encode("latin-1")]
    if injection.placement is Placement.BASIC:
        return [base64.b64encode(injection.username.encode() + b":" + secret)]
    return []


@dataclass
class Gateway:
    settings: GatewaySettings
    upstream: Upstream
    vault: VaultClient
    redis: aioredis.Redis
    secrets: SecretStore
    resolver: PinnedResolver
    keys: KeyCache
    verifier: TokenVerifier
    client: UpstreamClient
    audit: AuditSink
    metrics: Metrics
    http: httpx.AsyncClient
    revocations: RevocationWatcher
    budgets: Budgets
    slots: RunSlots
    detectors: Detectors
    webhook: WebhookSender
    approvals: ApprovalWaiter
    enterprise: Enterprise
    credentials: RunCredentials[Redactor] | None = None  # a run-scoped credential source's cache
    prewarm: Prewarm | None = None  # issues a new run's credential when the broker creates it
    # every issued credential still valid (this process's values, every replica's digests): the
    # passthrough scanner refuses them; one per process (the proxy's gateways share it)
    issued: IssuedValues = field(default_factory=lambda: IssuedValues(None))
    _scanner: tuple[int, CredentialScanner] | None = field(default=None, repr=False)
    _metrics_server: tuple[Any, Any] | None = field(default=None, repr=False)
    _redactor: tuple[int, Redactor] | None = field(default=None, repr=False)
    loop_errors: overload.QuietErrors | None = field(default=None, repr=False)

    @property
    def realm(self) -> str:
        return f"valetkey {self.upstream.name}"

    def scanner(self) -> CredentialScanner:
        """Provider patterns plus the real secrets held (rebuilt only when they rotate)."""
        if self._scanner is None or self._scanner[0] != self.secrets.version:
            self._scanner = (self.secrets.version, CredentialScanner(extra_exact=self.secrets.all_values(),
                                                                     issued=self.issued))
        return self._scanner[1]

    def share_forms(self, other: Gateway) -> None:
        """Use ``other``'s compiled scanner and redactor while both hold the same secrets (the
        egress proxy's destination hosts all scan and redact with one set)."""
        self._scanner, self._redactor = other._scanner, other._redactor

    def redactor_is_current(self) -> bool:
        return self._redactor is not None and self._redactor[0] == self.secrets.version

    def redactor(self) -> Redactor:
        """Every form of every secret held (current and recently rotated out) plus what the
        injection itself put on the wire; rebuilt only when the secrets change."""
        current = self._redactor
        if current is None or current[0] != self.secrets.version:
            values = [s.reveal().encode() for s in self.secrets.all_values()]
            extra = [f for v in values for f in injected_forms(self.upstream.injection, v)]
            current = self._redactor = (self.secrets.version, Redactor(values, extra))
        return current[1]

    async def forms(self, values: tuple[Secret, ...]) -> Redactor:
        """The redactor of one issued credential (and the value it replaced), built on the loop
        in steps of a millisecond or two (``Redactor.build``)."""
        raw = [v.reveal().encode() for v in values]
        return await Redactor.build(raw, [f for v in raw for f in injected_forms(self.upstream.injection, v)])

    @classmethod
    def build(cls, settings: GatewaySettings, upstream: Upstream, resolver: Resolver | None = None,
              alerting: Alerting | None = None, enterprise: Enterprise | None = None, *,
              shared: Gateway | None = None, dial_port: int | None = None,
              ca_file: str | None = None) -> Gateway:
        """Everything one upstream needs. ``shared``: another gateway of the same process whose
        Redis pool, JWKS cache, revocation watcher, audit, alerts, approvals and metrics this one
        uses (the egress proxy runs one gateway per host over one set of those).
        ``dial_port``/``ca_file``: the egress proxy's test resolver map and a destination's own CA
        bundle."""
        if shared is not None:
            return cls._beside(shared, settings, upstream, resolver, dial_port, ca_file)
        vault = VaultClient(settings.vault_addr, settings.vault_token or Secret(""))
        # one pool for budgets, audit, alerts and revocations, sized on purpose: a request waits
        # up to REDIS_POOL_WAIT for a free connection rather than failing at redis-py's cap
        redis = redis_url.async_client(settings.redis_url, max_connections=settings.redis_max_connections,
                                       pool_timeout=REDIS_POOL_WAIT)
        broker_tls: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=settings.broker_ca_file) if settings.broker_ca_file else True
        )
        http = httpx.AsyncClient(timeout=5.0, trust_env=False, verify=broker_tls)
        keys = KeyCache(http_fetcher(f"{settings.broker_url}/.well-known/jwks.json", http),
                        max_age=settings.jwks_max_age, max_stale=settings.jwks_max_stale)
        metrics = Metrics()
        policy = alerting or Alerting()
        revocations = RevocationWatcher(redis, max_stale=settings.revocation_max_stale,
                                        require_generation=True)
        # webhooks go to the on-call receiver: public CAs, not the broker's private CA
        webhook_url = settings.alert_webhook_url or policy.webhook_url
        webhook = WebhookSender(webhook_url, settings.alert_webhook_secret,
                                httpx.AsyncClient(timeout=5.0, trust_env=False))
        audit = AuditSink(redis, settings.audit_stream, settings.audit_maxlen, metrics,
                          settings.audit_buffer)
        detectors = Detectors(redis, policy, webhook, settings.audit_maxlen)
        audit.observer = detectors.observe
        gateway = cls(
            settings=settings, upstream=upstream, vault=vault, redis=redis,
            secrets=SecretStore(vault, upstream.secret, role_id=settings.approle_role_id,
                                secret_id=settings.approle_secret_id,
                                secret_id_file=settings.approle_secret_id_file,
                                refresh=settings.secret_refresh,
                                max_stale=settings.secret_max_stale),
            resolver=PinnedResolver(upstream.host, upstream.port, upstream.allow_private,
                                    resolver=resolver),
            keys=keys,
            verifier=TokenVerifier(issuer=settings.issuer, audience=upstream.name, keys=keys,
                                   run_check=revocations.run_check, leeway=settings.token_leeway),
            client=UpstreamClient(upstream, connect=settings.connect_timeout, read=settings.read_timeout,
                                  max_connections=settings.upstream_max_connections,
                                  ca_file=settings.upstream_ca_file),
            audit=audit, metrics=metrics, http=http, revocations=revocations,
            budgets=Budgets(redis, upstream, since=revocations.generation_since),
            slots=RunSlots(upstream.run_limits.concurrent),
            detectors=detectors, webhook=webhook,
            approvals=ApprovalWaiter(redis, settings.approval_max_held),
            enterprise=enterprise or Enterprise(), issued=IssuedValues(redis),
        )
        gateway.attach_source()
        return gateway

    def attach_source(self, ca_file: str | None = None) -> None:
        """The run-scoped credential source the upstream's policy names (none for ``kv``)."""
        ca = ca_file or self.settings.upstream_ca_file
        upstream_tls: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if ca else True
        source = build_source(self.upstream, self.vault, upstream_tls)
        if source is None:
            return
        credentials = RunCredentials(source, self.upstream.name, SourceMetrics(self.metrics.registry),
                                     self.forms, issued=self.issued)
        credentials.revoked = self.revocations.revoked
        self.revocations.listeners.append(lambda record: credentials.end_runs(record.covers))
        self.credentials = credentials
        self.prewarm = Prewarm(self.redis, credentials, self.upstream.name)

    @classmethod
    def _beside(cls, shared: Gateway, settings: GatewaySettings, upstream: Upstream,
                resolver: Resolver | None, dial_port: int | None, ca_file: str | None) -> Gateway:
        vault = VaultClient(settings.vault_addr, settings.vault_token or Secret(""))  # its own login
        gateway = cls(
            settings=settings, upstream=upstream, vault=vault, redis=shared.redis,
            secrets=SecretStore(vault, upstream.secret, role_id=settings.approle_role_id,
                                secret_id=settings.approle_secret_id,
                                secret_id_file=settings.approle_secret_id_file,
                                refresh=settings.secret_refresh, max_stale=settings.secret_max_stale),
            resolver=PinnedResolver(upstream.host, upstream.port, upstream.allow_private, resolver=resolver),
            keys=shared.keys,
            verifier=TokenVerifier(issuer=settings.issuer, audience=upstream.name, keys=shared.keys,
                                   run_check=shared.revocations.run_check, leeway=settings.token_leeway),
            client=UpstreamClient(upstream, connect=settings.connect_timeout, read=settings.read_timeout,
                                  max_connections=settings.upstream_max_connections,
                                  ca_file=ca_file or settings.upstream_ca_file, dial_port=dial_port),
            audit=shared.audit, metrics=shared.metrics, http=shared.http, revocations=shared.revocations,
            budgets=Budgets(shared.redis, upstream, since=shared.revocations.generation_since),
            slots=RunSlots(upstream.run_limits.concurrent),
            detectors=shared.detectors, webhook=shared.webhook, approvals=shared.approvals,
            enterprise=shared.enterprise, issued=shared.issued,
        )
        gateway.attach_source(ca_file)
        return gateway

    async def start(self) -> None:
        await self.start_shared()
        await self.start_own()

    async def start_own(self) -> None:
        """What is this upstream's alone: its secret (or credential source), forms, address."""
        await self.secrets.start()
        if self.credentials is not None:
            await Redactor.warm()  # an issued credential's forms then build in milliseconds
            await self.credentials.start()
        if self.prewarm is not None:
            await self.prewarm.start()
        await asyncio.to_thread(self.redactor)  # compile the forms now, not on the first request
        await self.resolver.start()

    async def stop_own(self) -> None:
        await self.budgets.close()  # before the Redis client closes: leases given back
        if self.prewarm is not None:
            await self.prewarm.stop()
        if self.credentials is not None:
            await self.credentials.stop()
        await self.secrets.stop()
        await self.resolver.stop()

    async def start_shared(self, upstreams: int = 1) -> None:
        """The parts every upstream of a process can share (the egress proxy runs many on one):
        fd limits, revocations, alert webhook, JWKS, audit, the metrics listener."""
        settings = self.settings
        self.loop_errors = overload.install(asyncio.get_running_loop(), overload.needed_fds(
            settings.max_connections, settings.upstream_max_connections * upstreams,
            settings.redis_max_connections))
        await self.revocations.start()
        await self.webhook.start()
        await self.keys.start()
        await self.audit.start()
        await self.approvals.start()
        await self.issued.start()
        if self.settings.metrics_listen is not None:
            host, port = self.settings.metrics_listen
            self._metrics_server = start_http_server(port, addr=host, registry=self.metrics.registry)

    async def stop(self) -> None:
        if self._metrics_server is not None:
            server, thread = self._metrics_server
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        await self.approvals.stop()
        await self.audit.stop()
        await self.webhook.stop()
        await self.revocations.stop()
        await self.stop_own()
        await self.issued.stop()  # after the sources: their revocations unpublish what they held
        await self.keys.stop()
        await self.client.aclose()
        await self.http.aclose()
        await self.vault.aclose()
        await self.redis.aclose()
