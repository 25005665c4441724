"""Checking a run request (grants + TTL) against policy; every refusal has a stable code.

Grants for the same upstream share one token (one audience, one placeholder variable): the token's
``grants`` claim lists each (purpose, params) granted for that upstream. A grant may name a
destination instead (``upstream`` or its synonym ``destination``: names are unique across both);
destinations are reached only through the egress proxy, so they need a broker with one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.claims import GrantClaim, params_view
from contract.errors import BadRequest, Forbidden, Reason
from policies.model import PolicySet, Runtime
from policies.templates import value_widens
from policies.units import parse_duration

MAX_GRANTS = 64
_REQUEST_KEYS = frozenset({"grants", "ttl"})
_GRANT_KEYS = frozenset({"upstream", "destination", "purpose", "params"})


@dataclass(frozen=True)
class RunRequest:
    ttl: int
    by_upstream: Mapping[str, tuple[GrantClaim, ...]]

    def grant_list(self) -> list[dict[str, Any]]:
        return [
            {"upstream": up, **g.to_json()} for up, gs in self.by_upstream.items() for g in gs
        ]


def parse_run_request(
    body: Any, runtime: Runtime, policies: PolicySet, default_ttl: int, proxy: bool = False
) -> RunRequest:
    """``proxy``: the broker has an egress proxy, so destination grants can be used."""
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object with grants and ttl")
    unknown = set(body) - _REQUEST_KEYS
    if unknown:
        raise BadRequest(f"unknown fields {sorted(unknown)}; allowed: grants, ttl")
    grants = body.get("grants")
    if not isinstance(grants, list) or not grants:
        raise BadRequest("grants must be a non-empty list")
    if len(grants) > min(runtime.max_grants, MAX_GRANTS):
        raise BadRequest(
            f"{len(grants)} grants requested; runtime {runtime.name} may have at most "
            f"{runtime.max_grants}", Reason.TOO_MANY_GRANTS,
        )
    ttl = _ttl(body.get("ttl"), runtime, default_ttl)
    by_upstream: dict[str, list[GrantClaim]] = {}
    for index, grant in enumerate(grants):
        upstream, claim = _grant(index, grant, runtime, policies, proxy)
        existing = by_upstream.setdefault(upstream, [])
        if claim in existing:
            raise BadRequest(f"grants[{index}] repeats an earlier grant", Reason.DUPLICATE_GRANT)
        existing.append(claim)
    return RunRequest(ttl=ttl, by_upstream={k: tuple(v) for k, v in by_upstream.items()})


def _ttl(raw: Any, runtime: Runtime, default_ttl: int) -> int:
    try:
        ttl = default_ttl if raw is None else parse_duration(raw)
    except ValueError as exc:
        raise BadRequest(f"ttl: {exc}") from None
    if ttl > runtime.max_ttl:
        raise BadRequest(
            f"ttl {ttl}s exceeds runtime {runtime.name}'s maximum of {runtime.max_ttl}s",
            Reason.TTL_TOO_LONG,
        )
    return ttl


def _grant(
    index: int, grant: Any, runtime: Runtime, policies: PolicySet, proxy: bool
) -> tuple[str, GrantClaim]:
    where = f"grants[{index}]"
    if not isinstance(grant, dict) or set(grant) - _GRANT_KEYS or {"upstream", "destination"} <= set(grant):
        raise BadRequest(f"{where} must be an object with upstream (or destination), purpose and params")
    upstream_name, purpose_name = grant.get("upstream", grant.get("destination")), grant.get("purpose")
    params = grant.get("params", {})
    if not isinstance(upstream_name, str) or not isinstance(purpose_name, str):
        raise BadRequest(f"{where}: upstream and purpose must be strings")
    if not isinstance(params, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in params.items()
    ):
        raise BadRequest(f"{where}: params must map names to strings")
    upstream = policies.target(upstream_name)
    if upstream is None:
        raise BadRequest(
            f"{where}: no upstream {upstream_name!r} in policy; upstreams: {sorted(policies.upstreams)}, "
            f"destinations: {sorted(policies.destinations)} "
            f"(runtime {runtime.name} may use {sorted(runtime.allow)})", Reason.UNKNOWN_AUDIENCE,
        )
    kind = "upstream" if upstream_name in policies.upstreams else "destination"
    purpose = upstream.purposes.get(purpose_name)
    if purpose is None:
        raise BadRequest(
            f"{where}: {kind} {upstream_name} has no purpose {purpose_name!r}; its purposes: "
            f"{sorted(upstream.purposes)}", Reason.UNKNOWN_PURPOSE,
        )
    if kind == "destination" and not proxy:
        raise BadRequest(
            f"{where}: destination {upstream_name} is reached through the egress proxy, and this "
            "broker has none (VALETKEY_PROXY_URL)", Reason.UNKNOWN_AUDIENCE,
        )
    if not runtime.may_grant(upstream_name, purpose_name):
        raise Forbidden(
            f"{where}: runtime {runtime.name} may not be granted {upstream_name}/{purpose_name}",
            Reason.PURPOSE_NOT_ALLOWED,
        )
    missing = sorted(set(purpose.params) - set(params))
    if missing:
        raise BadRequest(f"{where}: purpose {purpose_name} requires params {missing}",
                         Reason.MISSING_PARAM)
    extra = sorted(set(params) - set(purpose.params))
    if extra:
        raise BadRequest(f"{where}: purpose {purpose_name} does not take params {extra}",
                         Reason.EXTRA_PARAM)
    for name, value in params.items():
        if value_widens(value):
            raise BadRequest(
                f"{where}: param {name} must be one path segment of [A-Za-z0-9._~@+-], "
                "not '.' or '..'", Reason.PARAM_WIDENS_TEMPLATE,
            )
    return upstream_name, GrantClaim(purpose_name, params_view(dict(sorted(params.items()))))
