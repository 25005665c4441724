"""The one exception family of valetkey, and the stable reason codes.

    ValetkeyError                 code, status, detail; rendered as {"error": code, "detail": ...}
    ├── BadRequest                400  client sent something malformed or outside the contract
    ├── Unauthenticated           401  no caller identity, or a token that does not verify
    ├── Forbidden                 403  caller known, action not allowed by policy
    ├── NotFound                  404
    ├── Conflict                  409  the state changed under the request (an approval decided)
    ├── MethodNotAllowed          405
    ├── PayloadTooLarge           413
    ├── TooManyRequests           429  over a budget; carries Retry-After
    ├── UpstreamError             502  a dependency (Vault, Redis, upstream) failed
    ├── GatewayTimeout            504  the upstream did not answer in time
    └── Unavailable               503  fail-closed: state we rely on cannot be confirmed
        ├── Overloaded            503  over the broker's admission bound; carries Retry-After
        └── ServiceError          503  a local service (OpenBao, redis-server) failed to start

Foreign exceptions (hvac, redis, httpx) are translated where they enter, with
``raise ... from exc``; messages never carry a secret or a token.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, ClassVar


class Reason(StrEnum):
    """Stable reason codes: the same string in the response, the audit line and the metric."""

    OK = "ok"
    INTERNAL_ERROR = "internal_error"
    # request shape
    INVALID_REQUEST = "invalid_request"
    CLIENT_DISCONNECTED = "client_disconnected"
    BODY_TOO_LARGE = "body_too_large"
    INVALID_JSON = "invalid_json"  # contract/strictjson.py: not UTF-8 JSON, not an object, NaN...
    DUPLICATE_MEMBER = "duplicate_member"  # a member name twice in one JSON object
    JSON_TOO_DEEP = "json_too_deep"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    # caller identity
    UNAUTHENTICATED = "unauthenticated"
    UNKNOWN_CALLER = "unknown_caller"
    AMBIGUOUS_CALLER = "ambiguous_caller"
    NOT_ADMIN = "not_admin"
    # minting
    UNKNOWN_AUDIENCE = "unknown_audience"
    UNKNOWN_PURPOSE = "unknown_purpose"
    PURPOSE_NOT_ALLOWED = "purpose_not_allowed"
    MISSING_PARAM = "missing_param"
    EXTRA_PARAM = "extra_param"
    PARAM_WIDENS_TEMPLATE = "param_widens_template"
    TTL_TOO_LONG = "ttl_too_long"
    TOO_MANY_GRANTS = "too_many_grants"
    DUPLICATE_GRANT = "duplicate_grant"
    TOKEN_TOO_LARGE = "token_too_large"  # noqa: S105 - the grants would not fit MAX_TOKEN_BYTES
    PROXY_CA_UNAVAILABLE = "proxy_ca_unavailable"  # no deployment CA read from Vault yet (bundle, proxy)
    # tokens
    INVALID_TOKEN = "invalid_token"  # noqa: S105 - a reason code, not a secret
    AUDIENCE_MISMATCH = "audience_mismatch"
    TOKEN_REVOKED = "token_revoked"  # noqa: S105 - a reason code, not a secret
    # revocation and budgets
    REVOKED = "revoked"
    REVOCATION_NOT_FOUND = "revocation_not_found"  # lifting what does not stand
    UNKNOWN_REVOCATION_TARGET = "unknown_revocation_target"  # a runtime or upstream not in policy
    REVOCATION_STATE_STALE = "revocation_state_stale"
    BUDGET_EXCEEDED = "budget_exceeded"
    BUDGET_STATE_LOST = "budget_state_lost"  # contract/generation.py: the run outlived a Redis data loss
    RUN_CONCURRENCY_EXCEEDED = "run_concurrency_exceeded"  # gateways/runslots.py
    # approvals (contract/approvals.py, gateways/approval_step.py, broker/approvals.py)
    APPROVAL_DENIED = "approval_denied"  # a person said no to this request
    APPROVAL_TIMEOUT = "approval_timeout"  # nobody decided before the purpose's approval_timeout
    APPROVAL_QUEUE_FULL = "approval_queue_full"  # the run has its cap of requests waiting already
    APPROVAL_NOT_FOUND = "approval_not_found"
    APPROVAL_NOT_PENDING = "approval_not_pending"  # decided, timed out or cancelled already
    APPROVAL_DIGEST_MISMATCH = "approval_digest_mismatch"  # the decision names other bytes
    NOT_APPROVER = "not_approver"  # the caller is in no group that decides this approval
    ENTERPRISE_DENIED = "enterprise_denied"  # the enterprise deny list: never, whoever approves
    # console (broker/console.py)
    CSRF_FAILED = "csrf_failed"
    NO_SESSION = "no_session"
    OIDC_STATE_INVALID = "oidc_state_invalid"  # the callback's state is unknown, used, or not this browser's
    OIDC_TOKEN_INVALID = "oidc_token_invalid"  # noqa: S105 - a reason code; the ID token failed a check
    OIDC_PROVIDER_UNAVAILABLE = "oidc_provider_unavailable"  # discovery, JWKS or the token endpoint failed
    # dependencies
    VAULT_UNAVAILABLE = "vault_unavailable"
    REDIS_UNAVAILABLE = "redis_unavailable"
    SIGNING_FAILED = "signing_failed"
    BROKER_OVERLOADED = "broker_overloaded"  # broker/admission.py
    JWKS_UNAVAILABLE = "jwks_unavailable"  # contract/jwks.py: an unknown kid and no good fetch
    JWKS_STALE = "jwks_stale"  # contract/jwks.py: the key set is older than its bound
    # gateway: request framing and target
    ABSOLUTE_FORM_TARGET = "absolute_form_target"
    AMBIGUOUS_FRAMING = "ambiguous_framing"
    DUPLICATE_HOST = "duplicate_host"
    MALFORMED_REQUEST = "malformed_request"
    METHOD_REFUSED = "method_refused"
    # gateway: connections (gateways/server.py)
    CONNECTION_LIMIT = "connection_limit"
    REQUEST_HEAD_TIMEOUT = "request_head_timeout"
    # gateway: credentials and purposes
    MISSING_TOKEN = "missing_token"  # noqa: S105 - a reason code, not a secret
    PURPOSE_NOT_GRANTED = "purpose_not_granted"
    CREDENTIAL_PASSTHROUGH = "credential_passthrough"  # gateways/credential_scan.py
    # gateway: secrets and upstream
    SECRET_UNAVAILABLE = "secret_unavailable"  # noqa: S105 - a reason code, not a secret
    CREDENTIAL_SOURCE_UNAVAILABLE = "credential_source_unavailable"  # gateways/sources: 503
    CREDENTIAL_SOURCE_REFUSED = "credential_source_refused"  # gateways/sources: 502
    UPSTREAM_CONNECT_TIMEOUT = "upstream_connect_timeout"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    UPSTREAM_TLS_ERROR = "upstream_tls_error"
    UPSTREAM_PROTOCOL_ERROR = "upstream_protocol_error"
    UNDECODABLE_RESPONSE = "undecodable_response"  # gateways/encodings.py
    DECOMPRESSION_BOMB = "decompression_bomb"  # gateways/encodings.py
    SSE_EVENT_TOO_LARGE = "sse_event_too_large"  # gateways/sse.py
    # gateway: egress guard (gateways/egress.py)
    DEST_PRIVATE_RANGE = "dest_private_range"
    DEST_LOOPBACK = "dest_loopback"
    DEST_LINK_LOCAL = "dest_link_local"
    DEST_METADATA = "dest_metadata"
    DEST_RESERVED = "dest_reserved"
    DEST_UNSPECIFIED = "dest_unspecified"
    DEST_MULTICAST = "dest_multicast"
    DEST_INVALID = "dest_invalid"
    DEST_UNRESOLVABLE = "dest_unresolvable"
    # egress proxy (proxy/): which host a run may reach, and how the TLS inside a tunnel may look
    DESTINATION_NOT_ALLOWED = "destination_not_allowed"  # no destination or upstream names the host
    DESTINATION_IP_LITERAL = "destination_ip_literal"  # CONNECT or request to an address, not a name
    DESTINATION_PORT_NOT_ALLOWED = "destination_port_not_allowed"
    HOST_MISMATCH = "host_mismatch"  # Host inside a terminated tunnel is not the CONNECT host
    RUN_MISMATCH = "run_mismatch"  # a placeholder of another run than the proxy credential's
    SNI_MISSING = "sni_missing"  # a ClientHello without server_name
    SNI_MISMATCH = "sni_mismatch"  # server_name is not the CONNECT host (domain fronting)
    CLIENT_HELLO_INVALID = "client_hello_invalid"  # not a TLS ClientHello, or over its bound
    CLIENT_HELLO_TIMEOUT = "client_hello_timeout"
    TLS_HANDSHAKE_FAILED = "tls_handshake_failed"  # the client did not complete our TLS handshake
    # the Postgres gateway (gateways/pg_session.py): refusals of the wire protocol's start-up
    PROTOCOL_VIOLATION = "protocol_violation"  # not PostgreSQL protocol 3.0 as we speak it
    TLS_REQUIRED = "tls_required"  # a password over a non-TLS, non-loopback connection
    DATABASE_NOT_GRANTED = "database_not_granted"  # another database than the policy's
    PURPOSE_AMBIGUOUS = "purpose_ambiguous"  # several purposes granted, none named
    RUN_EXPIRED = "run_expired"  # the run's token expired while its session was open
    DATABASE_UNAVAILABLE = "database_unavailable"  # the database refused or could not be reached


class ValetkeyError(Exception):
    """Base of every error valetkey raises on purpose; carries a stable code and an HTTP status."""

    status: ClassVar[int] = 500
    default_reason: ClassVar[Reason] = Reason.INVALID_REQUEST

    def __init__(self, detail: str, reason: Reason | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason or self.default_reason
        self.extra = extra
        self.headers: dict[str, str] = {}  # extra response headers, e.g. WWW-Authenticate

    @property
    def code(self) -> str:
        return self.reason.value

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail, **self.extra}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason={self.code!r}, detail={self.detail!r})"


class BadRequest(ValetkeyError):
    status = 400
    default_reason = Reason.INVALID_REQUEST


class Unauthenticated(ValetkeyError):
    status = 401
    default_reason = Reason.UNAUTHENTICATED


class Forbidden(ValetkeyError):
    status = 403
    default_reason = Reason.PURPOSE_NOT_ALLOWED


class NotFound(ValetkeyError):
    status = 404
    default_reason = Reason.NOT_FOUND


class Conflict(ValetkeyError):
    status = 409
    default_reason = Reason.APPROVAL_NOT_PENDING


class MethodNotAllowed(ValetkeyError):
    status = 405
    default_reason = Reason.METHOD_REFUSED


class PayloadTooLarge(ValetkeyError):
    status = 413
    default_reason = Reason.BODY_TOO_LARGE


class TooManyRequests(ValetkeyError):
    status = 429
    default_reason = Reason.BUDGET_EXCEEDED


class UpstreamError(ValetkeyError):
    status = 502
    default_reason = Reason.VAULT_UNAVAILABLE


class GatewayTimeout(ValetkeyError):
    status = 504
    default_reason = Reason.UPSTREAM_TIMEOUT


class Unavailable(ValetkeyError):
    status = 503
    default_reason = Reason.VAULT_UNAVAILABLE


class Overloaded(Unavailable):
    """More work than the admission bound allows: refused at once, to be retried later."""

    default_reason = Reason.BROKER_OVERLOADED

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail, retry_after=retry_after)
        self.headers = {"retry-after": str(retry_after)}


class TokenInvalid(Unauthenticated):
    """A run token failed verification; ``check`` names the step that failed (for tests and logs)."""

    default_reason = Reason.INVALID_TOKEN

    def __init__(self, detail: str, check: str, reason: Reason | None = None) -> None:
        super().__init__(detail, reason)
        self.check = check
        # the signed claims, when the signature verified but a later rule failed: lets the gateway
        # attribute the refusal to its run (audit, alerts) without treating it as authenticated
        self.claims: Any = None


class ServiceError(Unavailable):
    """A local service spawned by ``valetkey.dev.services`` is missing, failed to start or stopped."""


class Decision(StrEnum):
    """What became of a request: the same word in the audit line, the metric label and the alerts."""

    ALLOW = "allow"
    DENY = "deny"  # refused on purpose (4xx): the caller asked for something it may not have
    ERROR = "error"  # could not be decided or done (5xx): a dependency failed, or a bug

    @classmethod
    def of(cls, exc: ValetkeyError) -> Decision:
        return cls.DENY if exc.status < 500 else cls.ERROR


JSON_HEADERS = ((b"content-type", b"application/json"), (b"cache-control", b"no-store"))


def render(exc: ValetkeyError, *, status: int | None = None,
           **fields: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The one JSON refusal of broker and gateways: status (the error's own unless given: a
    framework's 404 or 405 rendered our way), headers and
    ``{"error": code, "detail": ..., **extra, **fields}``."""
    body = json.dumps({**exc.body(), **fields}).encode()
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]
    return status or exc.status, headers, body
