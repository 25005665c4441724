"""Validated, frozen runtime objects of the policy language (built by ``policies.load``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from types import MappingProxyType

from policies.destinations import DestinationIndex, Entry, Route
from policies.hosts import HostPattern
from policies.sources import CredentialSource, KvSource
from policies.sources import SecretRef as SecretRef  # defined with the other sources; named here too
from policies.templates import PathTemplate

POLICY_VERSION = 1


class Placement(StrEnum):
    """Where the credential goes on the wire (and therefore where the placeholder is expected)."""

    HEADER = "header"
    BASIC = "basic"
    QUERY = "query"


@dataclass(frozen=True)
class Injection:
    """How the real secret is put on the wire.

    HEADER: ``header`` set to ``format`` with ``{secret}`` replaced; the placeholder is read from
    there or from any ``accept`` location (SDK generations differ: anthropic 1.x sends
    ``x-api-key``, 2.x ``Authorization: Bearer``).
    BASIC: ``Authorization: Basic base64(username:secret)``; the placeholder is the password.
    QUERY: query parameter ``param`` set to the secret.
    """

    placement: Placement
    header: str = ""
    format: str = "{secret}"
    username: str = ""
    param: str = ""
    # other (header, format) places a client may put the placeholder; injection stays as above
    accept: tuple[tuple[str, str], ...] = ()

    def header_names(self) -> frozenset[str]:
        """Lower-case header names the client may use to carry a credential for this upstream."""
        if self.placement is Placement.HEADER:
            return frozenset({self.header.lower(), *(h.lower() for h, _ in self.accept)})
        if self.placement is Placement.BASIC:
            return frozenset({"authorization"})
        return frozenset()


@dataclass(frozen=True)
class Rate:
    """``count`` requests per ``period`` seconds."""

    count: int
    period: int

    def __str__(self) -> str:
        return f"{self.count} per {self.period}s"


@dataclass(frozen=True)
class Limits:
    max_body: int | None = None
    rate: Rate | None = None


DEFAULT_RUN_CONCURRENCY = 64  # requests of one run in flight at once, per gateway process


@dataclass(frozen=True)
class RunLimits:
    """Optional totals for one run at one upstream, and how many of its requests may be in
    flight at once in one gateway process (so one run cannot take every upstream connection)."""

    requests: int | None = None
    bytes_out: int | None = None
    concurrent: int = DEFAULT_RUN_CONCURRENCY


DEFAULT_APPROVAL_TIMEOUT = 600  # seconds a held request waits for a person, unless the purpose says
MAX_APPROVAL_TIMEOUT = 3600  # a client connection held longer than this is not a request any more


@dataclass(frozen=True)
class Approval:
    """A purpose whose every request waits for a person: ``approvers`` names a group of the
    enterprise document ("" = the security team only); ``timeout`` in seconds."""

    approvers: str = ""
    timeout: int = DEFAULT_APPROVAL_TIMEOUT


@dataclass(frozen=True)
class Purpose:
    name: str
    why: str
    methods: frozenset[str]
    paths: tuple[PathTemplate, ...]
    params: tuple[str, ...]
    limits: Limits = Limits()
    # credential-named fields this purpose may send on (normalised: ``policies.credential_names``)
    allow_fields: frozenset[str] = frozenset()
    approval: Approval | None = None

    def template_params(self) -> frozenset[str]:
        return frozenset(p for t in self.paths for p in t.params)


@dataclass(frozen=True)
class SandboxEnv:
    """Environment variables the sandbox gets for this upstream."""

    placeholder: str
    base_url: str
    base_path: str = ""


@dataclass(frozen=True)
class PostgresTarget:
    """Where a Postgres gateway connects (``protocol: postgres``): the database's address, the one
    database its runs may use, and TLS to it (``disable``, ``require``, ``verify-full``)."""

    host: str
    port: int
    database: str
    tls: str = "verify-full"

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{shown}:{self.port}/{self.database}"


@dataclass(frozen=True)
class Upstream:
    name: str
    base_url: str
    scheme: str
    host: str
    port: int
    secret: SecretRef | None  # the KV secret (kind kv); None for another credential source
    injection: Injection
    env: SandboxEnv
    purposes: Mapping[str, Purpose]
    allow_private: bool = False
    run_limits: RunLimits = field(default_factory=lambda: RunLimits())
    source: str = ""  # the policy file
    credential_source: CredentialSource = field(default_factory=KvSource)
    protocol: str = "http"  # or "postgres" (policies/postgres_doc.py: no HTTP fields apply)
    postgres: PostgresTarget | None = None

    @property
    def origin(self) -> str:
        return self.base_url


class TlsMode(StrEnum):
    """What the proxy does with a destination's TLS: pass it through, or terminate and read it."""

    TUNNEL = "tunnel"  # hostname-only rule: SNI checked, bytes spliced, nothing inside seen
    TERMINATE = "terminate"  # the proxy's CA signs a leaf; methods and paths are checked


CONNECT_PURPOSE = "connect"  # the one grantable purpose of a tunnel destination
PLAIN_HTTP_PORT = 80  # a destination port the proxy always reads as plain HTTP


@dataclass(frozen=True)
class Destination:
    """A host (exact or ``*.suffix``) the sandbox may reach through the proxy, without a secret.

    ``purposes`` holds every grantable purpose: for ``tunnel`` exactly one, ``connect``, which has
    no methods or paths (it matches no request; the proxy never sees one inside a tunnel).
    """

    name: str
    host: HostPattern
    ports: frozenset[int]
    tls: TlsMode
    why: str
    purposes: Mapping[str, Purpose]
    ca_file: str = ""  # absolute path of a PEM bundle verifying this destination (terminate)
    allow_private: bool = False
    source: str = ""


Target = Upstream | Destination  # what covers a (host, port): upstreams are always terminate


@dataclass(frozen=True)
class Identity:
    """How a runtime is recognised from its Vault token lookup: any one field set."""

    vault_policy: str = ""
    approle_role: str = ""
    entity_id: str = ""


UNLISTED_PURPOSE = "unlisted_host"  # the purpose a request to an unlisted host is audited under
DEFAULT_UNLISTED_TIMEOUT = 300
DEFAULT_UNLISTED_MAX_BODY = 64 * 1024


@dataclass(frozen=True)
class UnlistedHosts:
    """Hosts no destination names that a runtime's requests may still reach through the egress
    proxy, each request only once a person approves it (``unlisted_hosts`` in a runtime). Nothing
    here is a grant: every request is asked about afresh, and the enterprise deny list wins."""

    ask: tuple[HostPattern, ...]
    ports: frozenset[int] = frozenset({443})
    approvers: str = ""  # an approver group of the enterprise document; "" = the security team
    timeout: int = DEFAULT_UNLISTED_TIMEOUT
    max_body: int = DEFAULT_UNLISTED_MAX_BODY
    allow_private: bool = False  # as for destinations (on-premises hosts); metadata never

    def asks(self, host: str, port: int) -> bool:
        """May a request to canonical ``host`` on ``port`` wait for a person?"""
        return port in self.ports and any(p.matches(host) for p in self.ask)

    @cached_property
    def purpose(self) -> Purpose:
        """What the pipeline holds such a request under: these methods, any path (no template:
        ``proxy.steps.authorize_unlisted`` admits every path, a person judges it), this body
        limit, and an approval of every request."""
        return Purpose(name=UNLISTED_PURPOSE, why="A host outside the policy, asked about per request.",
                       methods=UNLISTED_METHODS, paths=(), params=(),
                       limits=Limits(max_body=self.max_body),
                       approval=Approval(approvers=self.approvers, timeout=self.timeout))


UNLISTED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(frozen=True)
class Runtime:
    name: str
    identity: Identity
    allow: Mapping[str, frozenset[str]]
    max_ttl: int
    max_grants: int
    source: str = ""
    unlisted: UnlistedHosts | None = None  # None: a host no destination names is refused, never asked

    def may_grant(self, upstream: str, purpose: str) -> bool:
        """``upstream`` names an upstream or a destination."""
        return purpose in self.allow.get(upstream, frozenset())


class AlertKind(StrEnum):
    """Detectors over a run's recent decisions; the value is the alert's stable name."""

    DENIAL_BURST = "denial_burst"
    PROBING = "probing"
    CREDENTIAL_PASSTHROUGH = "credential_passthrough"
    SECRET_ECHOED = "secret_echoed"  # noqa: S105 - an alert name, not a secret
    BUDGET_EXHAUSTED = "budget_exhausted"


@dataclass(frozen=True)
class Threshold:
    count: int
    window: int  # seconds


@dataclass(frozen=True)
class Alerting:
    """Alert thresholds, which alerts revoke the run by themselves, and where alerts are sent."""

    thresholds: Mapping[AlertKind, Threshold] = field(default_factory=lambda: MappingProxyType({
        AlertKind.DENIAL_BURST: Threshold(10, 60),
        AlertKind.PROBING: Threshold(5, 300),
        AlertKind.CREDENTIAL_PASSTHROUGH: Threshold(1, 3600),
        AlertKind.SECRET_ECHOED: Threshold(1, 3600),
        AlertKind.BUDGET_EXHAUSTED: Threshold(1, 3600),
    }))
    auto_revoke: frozenset[AlertKind] = frozenset(
        {AlertKind.CREDENTIAL_PASSTHROUGH, AlertKind.DENIAL_BURST}
    )
    webhook_url: str = ""
    source: str = ""


@dataclass(frozen=True)
class ApproverGroup:
    """People who may decide the approvals of purposes naming this group: any Vault token that
    carries ``vault_policy``."""

    name: str
    vault_policy: str


@dataclass(frozen=True)
class DenyRule:
    """What can never be done at an upstream, whatever a runtime is granted and whoever approves:
    a whole purpose, or methods on path templates (checked on every request at the gateway)."""

    upstream: str
    why: str
    purpose: str = ""
    methods: frozenset[str] = frozenset()
    paths: tuple[PathTemplate, ...] = ()
    host: HostPattern | None = None  # a host rule (``upstream`` ""): never reached through the proxy

    def matches(self, upstream: str, purpose: str, method: str, segments: tuple[str, ...]) -> bool:
        if self.host is not None or upstream != self.upstream:
            return False
        if self.purpose:
            return purpose == self.purpose
        return method in self.methods and any(t.matches(segments, {}) for t in self.paths)


@dataclass(frozen=True)
class Enterprise:
    """The enterprise document: the deny list and the approver groups."""

    deny: tuple[DenyRule, ...] = ()
    approvers: Mapping[str, ApproverGroup] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""

    def denied(self, upstream: str, purpose: str, method: str, segments: tuple[str, ...]) -> DenyRule | None:
        return next((d for d in self.deny if d.matches(upstream, purpose, method, segments)), None)

    def denied_host(self, host: str) -> DenyRule | None:
        """The host rule naming canonical ``host`` (the egress proxy asks before routing)."""
        return next((d for d in self.deny if d.host is not None and d.host.matches(host)), None)


@dataclass(frozen=True)
class PolicySet:
    upstreams: Mapping[str, Upstream] = field(default_factory=lambda: MappingProxyType({}))
    runtimes: Mapping[str, Runtime] = field(default_factory=lambda: MappingProxyType({}))
    alerting: Alerting = field(default_factory=Alerting)
    enterprise: Enterprise = field(default_factory=Enterprise)
    destinations: Mapping[str, Destination] = field(default_factory=lambda: MappingProxyType({}))

    def target(self, name: str) -> Target | None:
        """The upstream or destination called ``name`` (names are unique across both)."""
        return self.upstreams.get(name) or self.destinations.get(name)

    @cached_property
    def _index(self) -> DestinationIndex[Target]:
        entries: list[Entry[Target]] = [
            Entry(HostPattern.exact(u.host), frozenset({u.port}), u) for u in self.upstreams.values()
        ]
        entries.extend(Entry(d.host, d.ports, d) for d in self.destinations.values())
        return DestinationIndex(entries)

    def route(self, host: str, port: int) -> Route[Target]:
        """The upstream or destination covering ``host:port``, or why none does (see
        ``policies.destinations``); built once per policy set, no I/O."""
        return self._index.route(host, port)

    def destination_for(self, host: str, port: int) -> Target | None:
        return self.route(host, port).target
