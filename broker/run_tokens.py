"""The tokens of one run: one per credentialed upstream, plus the proxy token when a proxy is set.

* Upstream tokens: audience = the upstream, ``grants`` = its (purpose, params), as before.
* The proxy token (``VALETKEY_PROXY_URL`` set): audience ``VALETKEY_PROXY_AUDIENCE`` (default
  ``egress``), one grant per granted (name, purpose) of destinations **and** upstreams, the
  purpose spelled ``"<name>/<purpose>"`` (``pypi/connect``, ``openai/chat``) with its params.
  Policy names never contain ``/``, so no upstream's own purpose can look like one.

Every token is checked against ``MAX_TOKEN_BYTES`` before it is signed: a longer one would be
refused by every verifier, so the run is refused instead (``400 token_too_large``).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.grants import RunRequest
from broker.proxy_settings import ProxySettings
from contract.claims import MAX_TOKEN_BYTES, AccessClaims, GrantClaim, proxy_purpose, token_bytes
from contract.errors import BadRequest, Reason
from policies.model import PolicySet


@dataclass(frozen=True)
class RunClaims:
    upstream: list[AccessClaims]  # in the order of the names granted
    proxy: AccessClaims | None

    def all(self) -> list[AccessClaims]:
        return [*self.upstream, *([self.proxy] if self.proxy else [])]

    @property
    def audiences(self) -> list[str]:
        return [c.aud for c in self.all()]


def proxy_grants(request: RunRequest) -> tuple[GrantClaim, ...]:
    return tuple(GrantClaim(proxy_purpose(name, g.purpose), g.params)
                 for name, grants in request.by_upstream.items() for g in grants)


def run_claims(*, request: RunRequest, policies: PolicySet, proxy: ProxySettings, issuer: str,
               run_id: str, runtime: str, now: int, key_name: str) -> RunClaims:
    upstream = [
        AccessClaims.new(issuer=issuer, run_id=run_id, audience=name, runtime=runtime,
                         grants=grants, now=now, ttl=request.ttl)
        for name, grants in request.by_upstream.items() if name in policies.upstreams
    ]
    proxy_claims = AccessClaims.new(
        issuer=issuer, run_id=run_id, audience=proxy.audience, runtime=runtime,
        grants=proxy_grants(request), now=now, ttl=request.ttl,
    ) if proxy.enabled else None
    claims = RunClaims(upstream, proxy_claims)
    for c in claims.all():
        size = token_bytes(c, key_name)
        if size > MAX_TOKEN_BYTES:
            raise BadRequest(
                f"the token for {c.aud} would be {size} bytes with {len(c.grants)} grants, over the "
                f"{MAX_TOKEN_BYTES}-byte limit every verifier enforces; ask for fewer grants or "
                "shorter params", Reason.TOKEN_TOO_LARGE)
    return claims
