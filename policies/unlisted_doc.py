"""Validation of a runtime's ``unlisted_hosts``: hosts outside the policy it may ask a person about.

```yaml
unlisted_hosts:              # optional; absent = never ask (403 destination_not_allowed)
  ask: ["*.partner.example", status.example.org]   # exact names or *.suffix (policies.hosts)
  ports: [443]               # default [443]; 80 is plain http
  approvers: vendors         # optional: an approver group of the enterprise document
  timeout: 5m                # how long one request waits for a person: 1s..1h, default 5m
  max_body: 64KiB            # a held request's body limit: at most 1MiB, default 64KiB
  allow_private: false       # as for destinations: private addresses too; metadata never
```

Only the egress proxy reads it. Nothing is granted: every request to such a host waits for a
fresh approval of that one request, and the enterprise deny list wins over it. ``cross_references``
refuses a pattern a destination or upstream already names (grant that instead), one the deny list
covers whole (it could never be asked), and an approver group the enterprise does not declare.
"""

from __future__ import annotations

from typing import Any

from policies.hosts import HostError, HostPattern
from policies.model import (
    MAX_APPROVAL_TIMEOUT,
    Destination,
    Enterprise,
    Runtime,
    UnlistedHosts,
    Upstream,
)
from policies.report import Problem, Report, keys, mapping, string
from policies.units import parse_duration, parse_size
from policies.upstream_doc import NAME

MAX_PATTERNS = 64
MAX_BODY_CEILING = 1024 * 1024  # a held body is kept in memory while a person decides


def unlisted_hosts(value: Any, rule: str, r: Report) -> UnlistedHosts | None:
    doc = mapping(value, rule, r)
    optional = {"ports", "approvers", "timeout", "max_body", "allow_private"}
    if doc is None or not keys(doc, rule, {"ask"}, optional, r):
        return None
    patterns = _patterns(doc["ask"], f"{rule} ask", r)
    ports = _ports(doc.get("ports", [443]), f"{rule} ports", r)
    approvers = doc.get("approvers", "")
    if approvers != "" and string(approvers, f"{rule} approvers", r, NAME) is None:
        return None
    try:
        timeout = parse_duration(doc.get("timeout", "5m"))
        max_body = parse_size(doc.get("max_body", "64KiB"))
    except ValueError as exc:
        r.add(rule, str(exc), "write e.g. `timeout: 5m` and `max_body: 64KiB`")
        return None
    allow_private = doc.get("allow_private", False)
    bounds = [  # (key, holds, message, fix)
        ("timeout", 1 <= timeout <= MAX_APPROVAL_TIMEOUT, f"{timeout}s is not 1s..{MAX_APPROVAL_TIMEOUT}s",
         "a held request keeps its client waiting: write at most `timeout: 1h`"),
        ("max_body", max_body <= MAX_BODY_CEILING, f"{max_body} bytes is over {MAX_BODY_CEILING}",
         "a held body stays in the proxy's memory: write at most `max_body: 1MiB`"),
        ("allow_private", isinstance(allow_private, bool), "expected true or false",
         "write `allow_private: false`"),
    ]
    for key, holds, message, fix in bounds:
        if not holds:
            r.add(f"{rule} {key}", message, fix)
            return None
    if patterns is None or ports is None:
        return None
    return UnlistedHosts(ask=patterns, ports=ports, approvers=approvers, timeout=timeout, max_body=max_body,
                         allow_private=allow_private)


def _patterns(value: Any, rule: str, r: Report) -> tuple[HostPattern, ...] | None:
    if not isinstance(value, list) or not value or len(value) > MAX_PATTERNS:
        r.add(rule, f"expected a list of 1 to {MAX_PATTERNS} host names",
              "e.g. `ask: ['*.partner.example']`; there is no pattern for every host")
        return None
    out: list[HostPattern] = []
    for i, raw in enumerate(value):
        if not isinstance(raw, str):
            r.add(f"{rule}[{i}]", f"{raw!r} is not a host name", "write a name such as status.example.org")
            return None
        try:
            out.append(HostPattern.parse(raw))
        except HostError as exc:
            r.add(f"{rule}[{i}]", exc.message, exc.fix)
            return None
    return tuple(out)


def _ports(value: Any, rule: str, r: Report) -> frozenset[int] | None:
    if not isinstance(value, list) or not value or not all(
            type(p) is int and 1 <= p <= 65535 for p in value):
        r.add(rule, f"{value!r} is not a list of port numbers", "write e.g. `ports: [443]`")
        return None
    return frozenset(value)


def cross_references(runtimes: dict[str, Runtime], upstreams: dict[str, Upstream],
                     destinations: dict[str, Destination], ent: Enterprise, problems: list[Problem]) -> None:
    named = {HostPattern.exact(u.host): f"upstream {u.name}" for u in upstreams.values()}
    named.update({d.host: f"destination {d.name}" for d in destinations.values()})
    for rt in runtimes.values():
        if rt.unlisted is None:
            continue
        r = Report(rt.source, problems)
        rule = f"runtime {rt.name} unlisted_hosts"
        for pattern in rt.unlisted.ask:
            if pattern in named:
                r.add(f"{rule} ask", f"{pattern} is named by {named[pattern]}",
                      "grant that destination's purposes instead of asking about it")
            deny = next((d for d in ent.deny if d.host is not None and d.host.covers(pattern)), None)
            if deny is not None:
                r.add(f"{rule} ask", f"{pattern} is denied by the enterprise ({deny.why})",
                      "remove it: a denied host is never asked about")
        group = rt.unlisted.approvers
        if group and group not in ent.approvers:
            r.add(f"{rule} approvers", f"unknown approver group {group!r}",
                  "declare it under `approvers:` in the enterprise document, or remove `approvers:`")
