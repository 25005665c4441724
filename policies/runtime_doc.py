"""Validation of ``kind: runtime`` documents, and the cross-references between documents.

"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from policies.model import Destination, Identity, Runtime, Upstream
from policies.report import Problem, Report, description, keys, label, mapping, string
from policies.units import parse_duration
from policies.unlisted_doc import unlisted_hosts
from policies.upstream_doc import NAME

MAX_RUN_TTL = 24 * 3600  # the verifier refuses longer token lifetimes
MAX_GRANTS_CEILING = 64
DEFAULT_MAX_GRANTS = 8


def runtime(doc: dict[str, Any], r: Report) -> Runtime | None:
    rule = label("runtime", doc)
    known = keys(doc, rule, {"version", "kind", "name", "identity", "allow"},
                  {"max_ttl", "max_grants", "description", "unlisted_hosts"}, r)
    name = string(doc["name"], f"{rule} name", r, NAME) if "name" in doc else None
    if not known or name is None or not description(doc, rule, r):
        return None
    ident = mapping(doc["identity"], f"{rule} identity", r)
    identity = None
    if ident is not None and keys(ident, f"{rule} identity", set(),
                                   {"vault_policy", "approle_role", "entity_id"}, r):
        if len(ident) != 1:
            r.add(f"{rule} identity", "needs exactly one of vault_policy, approle_role, entity_id",
                  "name the one Vault identity this runtime authenticates as")
        else:
            field, val = next(iter(ident.items()))
            if string(val, f"{rule} identity {field}", r) is not None:
                identity = Identity(**{field: val})
    allow = _allow(doc["allow"], f"{rule} allow", r)
    try:
        max_ttl = parse_duration(doc.get("max_ttl", "1h"))
    except ValueError as exc:
        r.add(f"{rule} max_ttl", str(exc), "write e.g. `max_ttl: 1h`")
        return None
    if max_ttl > MAX_RUN_TTL:
        r.add(f"{rule} max_ttl", f"{max_ttl}s is over the {MAX_RUN_TTL}s ceiling",
              "runs are short-lived: write at most `max_ttl: 24h`")
        return None
    max_grants = doc.get("max_grants", DEFAULT_MAX_GRANTS)
    if not isinstance(max_grants, int) or isinstance(max_grants, bool) or not (
        1 <= max_grants <= MAX_GRANTS_CEILING
    ):
        r.add(f"{rule} max_grants", f"{max_grants!r} is not 1..{MAX_GRANTS_CEILING}",
              "write a small whole number")
        return None
    unlisted = unlisted_hosts(doc["unlisted_hosts"], f"{rule} unlisted_hosts", r) if (
        "unlisted_hosts" in doc) else None
    if identity is None or allow is None or ("unlisted_hosts" in doc and unlisted is None):
        return None
    return Runtime(name=name, identity=identity, allow=MappingProxyType(allow), max_ttl=max_ttl,
                   max_grants=max_grants, source=r.file, unlisted=unlisted)


def _allow(value: Any, rule: str, r: Report) -> dict[str, frozenset[str]] | None:
    doc = mapping(value, rule, r)
    if doc is None:
        return None
    out: dict[str, frozenset[str]] = {}
    for upstream_name, purposes in doc.items():
        if not isinstance(purposes, list) or not purposes or not all(
            isinstance(p, str) for p in purposes
        ):
            r.add(f"{rule} {upstream_name}", "expected a list of purpose names",
                  "e.g. `github: [read_issues]`")
            return None
        out[str(upstream_name)] = frozenset(purposes)
    return out


def cross_references(
    upstreams: dict[str, Upstream], runtimes: dict[str, Runtime], problems: list[Problem],
    destinations: dict[str, Destination] | None = None,
) -> None:
    """Runtimes name only existing upstreams or destinations and their purposes (a tunnel
    destination's one purpose is ``connect``); identities and env vars are unique."""
    seen_identity: dict[Identity, str] = {}
    targets: dict[str, Upstream | Destination] = {**(destinations or {}), **upstreams}
    for rt in runtimes.values():
        r = Report(rt.source, problems)
        for up_name, purposes in rt.allow.items():
            up = targets.get(up_name)
            if up is None:
                kinds = "upstream or destination" if destinations else "upstream"
                r.add(f"runtime {rt.name} allow", f"unknown {kinds} {up_name!r}",
                      f"use one of {sorted(targets)}")
                continue
            for p in sorted(purposes - set(up.purposes)):
                r.add(f"runtime {rt.name} allow {up_name}", f"unknown purpose {p!r}",
                      f"use one of {sorted(up.purposes)}")
        if rt.identity in seen_identity:
            r.add(f"runtime {rt.name} identity",
                  f"same Vault identity as runtime {seen_identity[rt.identity]}",
                  "give each runtime its own Vault identity")
        seen_identity[rt.identity] = rt.name
    seen_env: dict[str, str] = {}
    for up in upstreams.values():
        for var in (up.env.placeholder, up.env.base_url):
            if var in seen_env:
                Report(up.source, problems).add(
                    f"upstream {up.name} env", f"variable {var} also used by {seen_env[var]}",
                    "give each upstream its own environment variables")
            seen_env[var] = up.name
