"""Deciding a CONNECT (and a plain-http request's target): who asks, for which host, granted or not.

    await admit(hub, host, port, headers, record) -> Admission    the steps, in order:
        credential  Proxy-Authorization Basic      missing_token, invalid_token, token_revoked,
                    (password = the run token)     audience_mismatch, revocation_state_stale… (407)
        target      a DNS name                     destination_ip_literal
        deny        no enterprise host rule        enterprise_denied (never asked about)
        route       a destination names host:port  destination_not_allowed, destination_port_not_allowed
                    (asked only for a verified run: the allowlist is not shown to strangers)
                    or the runtime's unlisted_hosts asks about it (then grant and egress wait)
        grant       the run holds a purpose there  purpose_not_granted
        egress      the address the name pins      dest_* (the egress guard), dest_unresolvable

Nothing is dialled before all of them pass. Each refusal is a ``ValetkeyError`` whose reason code
goes unchanged into the 407/403 body, the audit line and the metric.

An unlisted host's CONNECT is answered 200 once the route says the runtime may ask about it: no
DNS query names the host and nothing is dialled until a person has approved a request inside
the tunnel (``proxy.steps.resolve_unlisted`` then resolves, runs the egress guard, and dials).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, replace

from contract.claims import AccessClaims, grants_at
from contract.errors import BadRequest, Forbidden, Reason, TokenInvalid, Unauthenticated, ValetkeyError
from contract.verify import TokenVerifier
from gateways.audit import AuditRecord
from gateways.credentials import Headers
from gateways.egress import PinnedTarget
from gateways.gateway import Gateway
from policies.hosts import canonical_host, is_ip_literal
from proxy.hub import NOT_RESOLVED, Hub
from proxy.routes import Route, route, unlisted

REALM = "valetkey proxy"
CHALLENGE = f'Basic realm="{REALM}"'
TUNNEL_KEY = "valetkey.tunnel"  # the ASGI scope key of a request's Admission


@dataclass(frozen=True)
class Admission:
    route: Route
    token: str
    claims: AccessClaims  # the proxy credential's, its grants narrowed to this route's
    gateway: Gateway
    target: PinnedTarget  # NOT_RESOLVED for an unlisted host (resolved per approved request)
    verifier: TokenVerifier  # the proxy credential's, to check it again on every request


def parse_authority(authority: bytes) -> tuple[str, int]:
    """``host:port`` of a CONNECT (RFC 9110 §9.3.6: the port is required)."""
    text = authority.decode("latin-1")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise BadRequest("CONNECT needs host:port", Reason.INVALID_REQUEST)
    return host, int(port)


def credential(headers: Headers) -> str:
    """The run token from ``Proxy-Authorization: Basic base64(anything:token)``."""
    values = [v for k, v in headers if k == b"proxy-authorization"]
    if len(values) != 1:
        raise _challenge(Unauthenticated("send the run's proxy credential (the HTTPS_PROXY of its bundle)",
                                         Reason.MISSING_TOKEN))
    scheme, _, encoded = values[0].decode("latin-1").strip().partition(" ")
    try:  # a non-ASCII value is a ValueError of its own (not binascii.Error)
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors too
        decoded = ""
    _, sep, token = decoded.partition(":")
    if scheme.lower() != "basic" or not sep or not token:
        raise _challenge(Unauthenticated("Proxy-Authorization must be Basic with the run token as password",
                                         Reason.MISSING_TOKEN))
    return token


def _challenge(exc: Unauthenticated) -> Unauthenticated:
    exc.headers = {"proxy-authenticate": CHALLENGE}
    return exc


def proxy_status(exc: ValetkeyError) -> int | None:
    """A proxy answers an unauthenticated request 407 (RFC 9110 §15.5.8), not 401."""
    return 407 if isinstance(exc, Unauthenticated) else None


async def verify(hub: Hub, token: str, record: AuditRecord) -> AccessClaims:
    """The proxy credential verified for the proxy's audience and a live run (407 when not)."""
    try:
        claims = await hub.verifier.verify(token)
    except TokenInvalid as exc:
        if exc.claims is not None:
            record.run, record.runtime = exc.claims.sub, exc.claims.client_id
        raise _challenge(exc) from None
    record.run, record.runtime = claims.sub, claims.client_id
    return claims


def narrowed(claims: AccessClaims, name: str) -> AccessClaims:
    """The grants spelled ``name/purpose``, as the purposes of ``name`` (what ``authorize`` reads)."""
    return replace(claims, grants=grants_at(claims.grants, name))


async def admit(hub: Hub, host: str, port: int, headers: Headers, record: AuditRecord) -> Admission:
    token = credential(headers)
    verified = await verify(hub, token, record)
    if is_ip_literal(host):
        raise Forbidden("destinations are named, never addressed: an IP literal is refused",
                        Reason.DESTINATION_IP_LITERAL)
    name = canonical_host(host)
    denied = hub.policies.enterprise.denied_host(name) if name is not None else None
    if denied is not None:
        raise Forbidden(f"never reached, whoever approves: {denied.why}", Reason.ENTERPRISE_DENIED)
    try:
        target = route(hub.policies, host, port)  # after the credential: the allowlist is not for strangers
    except Forbidden as exc:
        target = unlisted(hub.policies, verified.client_id, name, port, exc)
    record.upstream = target.name
    if target.unlisted is not None:  # nothing granted, nothing resolved: each request is asked about
        record.host = target.host
        gateway = await hub.gateway(target)
        return Admission(target, token, narrowed(verified, target.name), gateway, NOT_RESOLVED, hub.verifier)
    try:
        hub.base.revocations.check(verified, target.name)  # a destination revoked by name
    except TokenInvalid as exc:  # the run is fine; this host is closed to it
        raise Forbidden(f"{target.name} is revoked: {exc.detail}", Reason.TOKEN_REVOKED) from None
    claims = narrowed(verified, target.name)
    if not claims.grants:
        raise Forbidden(f"this run holds no purpose at {target.name}", Reason.PURPOSE_NOT_GRANTED)
    gateway = await hub.gateway(target)
    pinned = gateway.resolver.current()
    dial = hub.settings.connect_to.get((target.host, target.port))
    record.upstream_addr = f"{pinned.address}:{dial[1] if dial else target.port}"
    return Admission(target, token, claims, gateway, pinned, hub.verifier)
