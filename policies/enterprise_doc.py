"""Validation of the ``kind: enterprise`` document: the deny list and the approver groups.

    version: 1
    kind: enterprise
    approvers:
      releases: {vault_policy: valetkey-approvers-releases}
    deny:
      - upstream: github
        why: Transferring a repository out of the organisation is never done by an agent.
        methods: [POST]
        paths: [/repos/{owner}/{repo}/transfer]
      - {upstream: github, purpose: delete_repo, why: ...}
      - {host: "*.paste.example", why: ...}     # the egress proxy never reaches it, nor asks

At most one such document per policy set. A deny rule can never be approved: the gateway refuses
what it matches before any approval is asked (``enterprise_denied``), and a runtime whose ``allow``
names a denied purpose does not load. A host rule (exact or ``*.suffix``) is refused by the egress
proxy before anything else (``enterprise_denied``): a runtime's ``unlisted_hosts`` can never ask
about it, and no destination or upstream may name a host it covers. ``cross_references`` checks
the names once every file is read.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from policies.hosts import HostError, HostPattern
from policies.model import ApproverGroup, DenyRule, Destination, Enterprise, Runtime, Upstream
from policies.report import Problem, Report, keys, mapping, string
from policies.templates import PathTemplate, TemplateError
from policies.upstream_doc import METHODS, NAME, PURPOSE_NAME


def enterprise(doc: dict[str, Any], r: Report) -> Enterprise | None:
    rule = "enterprise"
    if not keys(doc, rule, {"version", "kind"}, {"description", "deny", "approvers"}, r):
        return None
    groups = _approvers(doc.get("approvers", {}), f"{rule} approvers", r)
    raw = doc.get("deny", [])
    if not isinstance(raw, list):
        r.add(f"{rule} deny", "expected a list of rules", "write `deny: [{upstream: ..., why: ...}]`")
        return None
    rules = [_deny(item, f"{rule} deny[{i}]", r) for i, item in enumerate(raw)]
    if groups is None or None in rules:
        return None
    return Enterprise(deny=tuple(d for d in rules if d is not None), approvers=MappingProxyType(groups),
                      source=r.file)


def _approvers(value: Any, rule: str, r: Report) -> dict[str, ApproverGroup] | None:
    doc = mapping(value, rule, r)
    if doc is None:
        return None
    out: dict[str, ApproverGroup] = {}
    for name, body in doc.items():
        grule = f"{rule} {name}"
        spec = mapping(body, grule, r)
        if not isinstance(name, str) or not NAME.fullmatch(name):
            r.add(grule, f"{name!r} is not a group name", "lower-case letters, digits and '-'")
            continue
        if spec is None or not keys(spec, grule, {"vault_policy"}, set(), r):
            continue
        policy = string(spec["vault_policy"], f"{grule} vault_policy", r)
        if policy is not None:
            out[name] = ApproverGroup(name=name, vault_policy=policy)
    return out if len(out) == len(doc) else None


def _deny(value: Any, rule: str, r: Report) -> DenyRule | None:
    doc = mapping(value, rule, r)
    if doc is None or not keys(doc, rule, {"why"}, {"upstream", "purpose", "methods", "paths", "host"}, r):
        return None
    why = doc["why"]
    if not isinstance(why, str) or len(why.strip().splitlines()) != 1:
        r.add(f"{rule} why", "needs a one-line reason", "say in one sentence why this is never done")
        return None
    if ("host" in doc) == ("upstream" in doc):
        r.add(rule, "needs exactly one of upstream and host",
              "deny a purpose or methods at an `upstream:`, or a whole `host:` at the egress proxy")
        return None
    if "host" in doc:
        return _deny_host(doc, why.strip(), rule, r)
    upstream = string(doc["upstream"], f"{rule} upstream", r, NAME)
    if upstream is None:
        return None
    if "purpose" in doc:
        if "methods" in doc or "paths" in doc:
            r.add(rule, "both a purpose and methods/paths", "deny either a whole purpose or methods on paths")
            return None
        purpose = string(doc["purpose"], f"{rule} purpose", r, PURPOSE_NAME)
        return None if purpose is None else DenyRule(upstream=upstream, why=why.strip(), purpose=purpose)
    methods, paths = doc.get("methods"), doc.get("paths")
    if not isinstance(methods, list) or not methods or not all(
            isinstance(m, str) and m.upper() in METHODS for m in methods):
        r.add(f"{rule} methods", f"{methods!r} is not a list of HTTP methods",
              f"write e.g. `methods: [DELETE]` from {sorted(METHODS)}, or deny a `purpose:`")
        return None
    if not isinstance(paths, list) or not paths:
        r.add(f"{rule} paths", "expected a non-empty list of path templates", "e.g. `paths: [/orgs/{org}]`")
        return None
    templates: list[PathTemplate] = []
    for i, raw in enumerate(paths):
        try:
            templates.append(PathTemplate.parse(str(raw)))
        except TemplateError as exc:
            r.add(f"{rule} paths[{i}]", str(exc), "name a concrete path with {param} segments")
    if len(templates) != len(paths):
        return None
    return DenyRule(upstream=upstream, why=why.strip(), methods=frozenset(m.upper() for m in methods),
                    paths=tuple(templates))


def _deny_host(doc: dict[str, Any], why: str, rule: str, r: Report) -> DenyRule | None:
    if set(doc) - {"host", "why"}:
        r.add(rule, "a host rule denies the whole host", "remove purpose, methods and paths from it")
        return None
    raw = string(doc["host"], f"{rule} host", r)
    if raw is None:
        return None
    try:
        return DenyRule(upstream="", why=why, host=HostPattern.parse(raw))
    except HostError as exc:
        r.add(f"{rule} host", exc.message, exc.fix)
        return None


def cross_references(ent: Enterprise, upstreams: dict[str, Upstream], runtimes: dict[str, Runtime],
                     problems: list[Problem], destinations: dict[str, Destination] | None = None) -> None:
    """Deny rules name upstreams and purposes that exist; no runtime may be granted a denied
    purpose; every ``approvers`` group a purpose names is declared here; no upstream or
    destination names a host a host rule covers (it could never be reached)."""
    r = Report(ent.source or "enterprise", problems)
    named = [(HostPattern.exact(u.host), f"upstream {u.name}", u.source) for u in upstreams.values()]
    named += [(d.host, f"destination {d.name}", d.source) for d in (destinations or {}).values()]
    for i, rule in enumerate(ent.deny):
        if rule.host is not None:
            for pattern, what, source in named:
                if rule.host.covers(pattern):
                    Report(source, problems).add(
                        what, f"{pattern} is denied by the enterprise (deny[{i}]: {rule.why})",
                        "remove it: a denied host is never reached")
            continue
        up = upstreams.get(rule.upstream)
        if up is None:
            r.add(f"enterprise deny[{i}] upstream", f"unknown upstream {rule.upstream!r}",
                  f"use one of {sorted(upstreams)}")
        elif rule.purpose and rule.purpose not in up.purposes:
            r.add(f"enterprise deny[{i}] purpose", f"unknown purpose {rule.purpose!r}",
                  f"use one of {sorted(up.purposes)}")
    for rt in runtimes.values():
        for i, rule in enumerate(ent.deny):
            if rule.purpose and rule.purpose in rt.allow.get(rule.upstream, frozenset()):
                Report(rt.source, problems).add(
                    f"runtime {rt.name} allow {rule.upstream}",
                    f"purpose {rule.purpose!r} is denied by the enterprise (deny[{i}]: {rule.why})",
                    "remove it from the runtime: a denied purpose can never be granted nor approved")
    for up in upstreams.values():
        for purpose in up.purposes.values():
            group = purpose.approval.approvers if purpose.approval else ""
            if group and group not in ent.approvers:
                Report(up.source, problems).add(
                    f"upstream {up.name} purpose {purpose.name} approvers",
                    f"unknown approver group {group!r}",
                    "declare it under `approvers:` in the enterprise document, or remove `approvers:`")
