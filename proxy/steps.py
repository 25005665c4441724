"""The proxy's step lists: the gateway pipeline's own steps, with the tunnel's checks in front.

    UPSTREAM_STEPS     (a credentialed upstream's host)
        (gateways.pipeline.STEPS with the tunnel's steps put in; see ``_derived``)
        check_request → check_tunnel → refuse_passthrough → authenticate → same_run → authorize
        → refuse_credential_fields → hold_run_slot → charge_budget → read_body → refuse_run_tokens
        → hold_for_approval → inject_secret → dial_and_stream
    DESTINATION_STEPS  (a destination's host, terminated or plain http)
        check_request → check_tunnel → refuse_passthrough → authenticate_tunnel → authorize
        → refuse_credential_fields → hold_run_slot → charge_budget → read_body → refuse_run_tokens
        → hold_for_approval → strip_credentials → dial_and_stream
    UNLISTED_STEPS     (a host no destination names, that the run's runtime may ask about)
        check_request → check_tunnel → refuse_passthrough → authenticate_tunnel
        → authorize_unlisted → … → read_body → refuse_run_token → refuse_run_tokens → hold_for_approval
        → strip_credentials → resolve_unlisted → dial_and_stream

``check_tunnel`` holds every request to its tunnel: ``Host`` names the CONNECT host, and the run's
proxy credential is verified again (expiry, revocation) on each request, not only on the CONNECT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contract.errors import BadRequest, Forbidden, MethodNotAllowed, Reason, TokenInvalid
from gateways import pipeline as p
from gateways.exchange import Exchange
from gateways.paths import canonical_path
from proxy.connect import TUNNEL_KEY, Admission, narrowed

if TYPE_CHECKING:
    from gateways.gateway import Gateway



def admission_of(ex: Exchange) -> Admission:
    admission = ex.scope.get(TUNNEL_KEY)
    if not isinstance(admission, Admission):
        raise TokenInvalid("no proxy credential for this request", check="pipeline")
    return admission


def _host_port(value: bytes, default_port: int) -> tuple[str, int]:
    text = value.decode("latin-1").strip().lower()
    host, sep, port = text.rpartition(":")
    if sep and port.isdigit() and "]" not in port:
        return host.rstrip("."), int(port)
    return text.rstrip("."), default_port


async def check_tunnel(gw: Gateway, ex: Exchange) -> None:
    """The request is for the tunnel's host, and the run's proxy credential still holds.
    Reasons: host_mismatch, duplicate_host, invalid_token, token_revoked, revocation_state_stale."""
    admission = admission_of(ex)
    hosts = ex.header(b"host")
    if len(hosts) > 1:
        raise BadRequest("more than one Host header", Reason.DUPLICATE_HOST)
    route = admission.route
    default_port = 80 if route.plain else 443
    if len(hosts) != 1 or _host_port(hosts[0], default_port) != (route.host, route.port):
        raise BadRequest(f"Host must name {route.host}, the host this tunnel was opened for",
                         Reason.HOST_MISMATCH)
    claims = await admission.verifier.verify(admission.token)
    gw.revocations.check(claims, admission.route.name)
    ex.record.run, ex.record.runtime = claims.sub, claims.client_id


async def authenticate_tunnel(gw: Gateway, ex: Exchange) -> None:
    """A destination's requests carry no placeholder: the run is the proxy credential's, and
    its purposes are those granted at this destination. Fills claims."""
    admission = admission_of(ex)
    claims = await admission.verifier.verify(admission.token)
    ex.claims = narrowed(claims, admission.route.name)
    ex.record.run, ex.record.runtime = claims.sub, claims.client_id


async def same_run(gw: Gateway, ex: Exchange) -> None:
    """The placeholder is of the run the proxy credential names. Reason: run_mismatch (audited
    against the proxy credential's run: the sandbox that sent another run's placeholder)."""
    tunnel = admission_of(ex).claims
    if ex.claims is None or ex.claims.sub != tunnel.sub:
        ex.record.run, ex.record.runtime = tunnel.sub, tunnel.client_id
        raise Forbidden("the placeholder belongs to another run than the proxy credential",
                        Reason.RUN_MISMATCH)


async def strip_credentials(gw: Gateway, ex: Exchange) -> None:
    """A destination gets no secret: every client credential and routing header is removed,
    and the body comes back unencoded so it can be redacted. Fills upstream_headers."""
    headers = ex.forwarded(gw.upstream.injection)
    ex.upstream_headers = [*headers, (b"accept-encoding", b"identity")]
    ex.upstream_query = ex.query


async def authorize_unlisted(gw: Gateway, ex: Exchange) -> None:
    """A host no destination names: any method and path, under the runtime's ``unlisted_hosts``
    purpose, whose every request ``hold_for_approval`` then holds for a person (its body within
    the purpose's ``max_body``). Nothing the run holds is a grant here. Fills path and purpose.
    Reasons: destination_not_allowed (no asking for this tunnel), method_refused."""
    asks = admission_of(ex).route.unlisted
    if asks is None:
        raise Forbidden("no destination in policy names this host", Reason.DESTINATION_NOT_ALLOWED)
    purpose = asks.purpose
    if ex.method not in purpose.methods:
        raise MethodNotAllowed(f"{ex.method} is never asked about")
    ex.path = canonical_path(bytes(ex.scope.get("raw_path") or b"/"))
    ex.purpose = purpose
    ex.record.purpose, ex.record.host = purpose.name, gw.client.host_header


async def refuse_run_token(gw: Gateway, ex: Exchange) -> None:
    """The run's own proxy credential sent to a host outside the policy in a header other than
    ``Proxy-Authorization`` is refused before anyone is asked, even in a header that would not
    leave (``Authorization``, a cookie). Wherever else it would leave (body, query, path, kept
    headers) the shared ``refuse_run_tokens`` refuses every run token. Reason: credential_passthrough."""
    token = admission_of(ex).token.encode()
    if any(token in v for k, v in ex.headers if k != b"proxy-authorization"):
        ex.record.passthrough = "run token"
        raise Forbidden("the run's own proxy credential is never sent to a host outside the policy",
                        Reason.CREDENTIAL_PASSTHROUGH)


async def resolve_unlisted(gw: Gateway, ex: Exchange) -> None:
    """An unlisted host is resolved now, for a request a person approved, and not before: the
    egress guard judges every address (``dest_*``) and ``dial_and_stream`` dials the one pinned.
    Reasons: dest_* (private, metadata, …), dest_unresolvable."""
    target = await gw.resolver.load()
    ex.record.upstream_addr = f"{target.address}:{target.port}"


def _derived(replace: dict[p.Step, p.Step], after: dict[p.Step, p.Step]) -> tuple[p.Step, ...]:
    """The gateway's STEPS with some replaced and some inserted after others: a step added to the
    gateway pipeline (approvals, a new check) runs in the proxy too, in the same place."""
    steps: list[p.Step] = []
    for step in p.STEPS:
        steps.append(replace.get(step, step))
        if step in after:
            steps.append(after[step])
    return tuple(steps)


UPSTREAM_STEPS = _derived({}, {p.check_request: check_tunnel, p.authenticate: same_run})
DESTINATION_STEPS = _derived({p.authenticate: authenticate_tunnel, p.inject_secret: strip_credentials},
                             {p.check_request: check_tunnel})
UNLISTED_STEPS = _derived({p.authenticate: authenticate_tunnel, p.authorize: authorize_unlisted,
                           p.inject_secret: strip_credentials},
                          {p.check_request: check_tunnel, p.read_body: refuse_run_token,
                           p.inject_secret: resolve_unlisted})
