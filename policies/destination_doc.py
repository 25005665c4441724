"""Validation of ``kind: destination`` documents: hosts the sandbox reaches through the proxy.

```yaml
version: 1
kind: destination
name: pypi
why: Install Python packages the task needs.
host: pypi.org                # exact, or *.example.com (see policies.hosts)
ports: [443]                  # default [443]; 80 is plain HTTP, read like terminate
tls: tunnel                   # tunnel | terminate
ca_file: ""                   # terminate only: PEM bundle verifying this destination
allow_private: false
purposes: {...}               # terminate only (required there); tunnel grants `connect`
```
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

from policies.hosts import HostError, HostPattern
from policies.model import (
    CONNECT_PURPOSE,
    PLAIN_HTTP_PORT,
    Destination,
    Purpose,
    TlsMode,
    Upstream,
)
from policies.report import Problem, Report, description, keys, label, string
from policies.upstream_doc import NAME, purpose_table

DEFAULT_PORTS = (443,)
MAX_PORTS = 16
PEM_CERT = "-----BEGIN CERTIFICATE-----"


def destination(doc: dict[str, Any], r: Report) -> Destination | None:
    rule = label("destination", doc)
    known = keys(doc, rule, {"version", "kind", "name", "why", "host", "tls"},
                 {"description", "ports", "ca_file", "allow_private", "purposes"}, r)
    name = string(doc["name"], f"{rule} name", r, NAME) if "name" in doc else None
    if not known or name is None or not description(doc, rule, r):
        return None
    why = _why(doc["why"], f"{rule} why", r)
    host = _host(doc["host"], f"{rule} host", r)
    ports = _ports(doc.get("ports", list(DEFAULT_PORTS)), f"{rule} ports", r)
    tls = _tls(doc["tls"], f"{rule} tls", r)
    allow_private = doc.get("allow_private", False)
    if not isinstance(allow_private, bool):
        r.add(f"{rule} allow_private", "expected true or false", "write `allow_private: false`")
        return None
    if why is None or host is None or ports is None or tls is None:
        return None
    ca_file = _ca_file(doc.get("ca_file", ""), tls, f"{rule} ca_file", r)
    purposes = _purposes(doc, tls, ports, why, rule, r)
    if ca_file is None or purposes is None:
        return None
    return Destination(name=name, host=host, ports=ports, tls=tls, why=why,
                       purposes=MappingProxyType(purposes), ca_file=ca_file,
                       allow_private=allow_private, source=r.file)


def _why(value: Any, rule: str, r: Report) -> str | None:
    if not isinstance(value, str) or not value.strip() or len(value.strip().splitlines()) != 1:
        r.add(rule, "needs a one-line reason", "write one sentence saying why the sandbox goes there")
        return None
    return value.strip()


def _host(value: Any, rule: str, r: Report) -> HostPattern | None:
    raw = string(value, rule, r)
    if raw is None:
        return None
    try:
        return HostPattern.parse(raw)
    except HostError as exc:
        r.add(rule, exc.message, exc.fix)
        return None


def _ports(value: Any, rule: str, r: Report) -> frozenset[int] | None:
    fix = "write e.g. `ports: [443]`"
    if not isinstance(value, list) or not value or len(value) > MAX_PORTS:
        r.add(rule, f"expected a list of 1 to {MAX_PORTS} ports", fix)
        return None
    for port in value:
        if type(port) is not int or not 1 <= port <= 65535:
            r.add(rule, f"{port!r} is not a port number 1..65535", fix)
            return None
    if len(set(value)) != len(value):
        r.add(rule, f"a port is named twice in {value}", "name each port once")
        return None
    return frozenset(value)


def _tls(value: Any, rule: str, r: Report) -> TlsMode | None:
    mode = next((m for m in TlsMode if m.value == value), None)
    if mode is None:
        r.add(rule, f"{value!r} is not tunnel or terminate",
              "write `tls: tunnel` (host rule only) or `tls: terminate` (methods and paths)")
    return mode


def _ca_file(value: Any, tls: TlsMode, rule: str, r: Report) -> str | None:
    if value == "":
        return ""
    raw = string(value, rule, r)
    if raw is None:
        return None
    if tls is TlsMode.TUNNEL:
        r.add(rule, "a tunnel destination's TLS is verified by the client, not the proxy",
              "remove ca_file, or use `tls: terminate`")
        return None
    path = Path(raw) if Path(raw).is_absolute() else Path(r.file).resolve().parent / raw
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        r.add(rule, f"cannot read {path}: {type(exc).__name__}",
              "name a PEM bundle that exists (relative paths start at the policy file)")
        return None
    if PEM_CERT not in text:
        r.add(rule, f"{path} holds no PEM certificate", "name a PEM bundle of CA certificates")
        return None
    return str(path)


def _purposes(doc: dict[str, Any], tls: TlsMode, ports: frozenset[int], why: str, rule: str,
              r: Report) -> dict[str, Purpose] | None:
    if tls is TlsMode.TUNNEL:
        if PLAIN_HTTP_PORT in ports:
            r.add(f"{rule} ports", "port 80 is plain HTTP: the proxy reads every request there",
                  "use `tls: terminate` with purposes, or drop port 80")
            return None
        if "purposes" in doc:
            r.add(f"{rule} purposes", "a tunnel destination has no purposes: the proxy cannot see "
                  "methods or paths inside the tunnel; its one grantable purpose is `connect`",
                  "remove purposes, or use `tls: terminate` for method and path rules")
            return None
        return {CONNECT_PURPOSE: Purpose(name=CONNECT_PURPOSE, why=why, methods=frozenset(),
                                         paths=(), params=())}
    if "purposes" not in doc:
        r.add(rule, "missing key 'purposes'",
              "a terminate destination names what may be sent: add `purposes:` with methods and paths")
        return None
    table = purpose_table(doc["purposes"], rule, r)
    if table is not None and CONNECT_PURPOSE in table:
        r.add(f"{rule} purpose {CONNECT_PURPOSE}", "`connect` is the implicit purpose of tunnel "
              "destinations", "give the purpose another name")
        return None
    return table


def cross_references(upstreams: dict[str, Upstream], destinations: dict[str, Destination],
                     problems: list[Problem]) -> None:
    """Names are unique across upstreams and destinations; no two entries claim one host:port."""
    claimed: dict[tuple[str, int], str] = {
        (u.host, u.port): f"upstream {u.name}" for u in upstreams.values()
    }
    for dest in destinations.values():
        r = Report(dest.source, problems)
        if dest.name in upstreams:
            r.add(f"destination {dest.name}",
                  f"name also used by upstream {dest.name} ({upstreams[dest.name].source})",
                  "names are unique across upstreams and destinations: rename one")
        for port in sorted(dest.ports):
            key = (dest.host.raw, port)
            if key in claimed:
                hint = ("a credentialed upstream is a destination already: grant its purposes"
                        if claimed[key].startswith("upstream") else "merge the two documents")
                r.add(f"destination {dest.name} host", f"{dest.host}:{port} is also {claimed[key]}",
                      hint)
            else:
                claimed[key] = f"destination {dest.name}"
