"""Validation of ``kind: upstream`` documents with ``protocol: postgres`` (the Postgres gateway).

```yaml
version: 1
kind: upstream
name: appdb
protocol: postgres
postgres: {host: db.internal, port: 5432, database: app, tls: verify-full}
source: {kind: vault_database, mount: database, roles: {read: valetkey-appdb-ro}}
env: {placeholder: PGPASSWORD, base_url: DATABASE_URL}
purposes:
  read: {why: Read the application's tables., limits: {rate: "600 per 1m"}}
```

A purpose names what the run may do in the database; the Vault role it maps to (``source.roles``)
creates a database user whose role memberships enforce it. There is no HTTP here: no base_url,
inject, methods or paths. ``run_limits.requests`` counts queries, ``concurrent`` sessions.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

from policies.alerts_doc import run_limits
from policies.model import Injection, Limits, Placement, PostgresTarget, Purpose, Rate, SandboxEnv, Upstream
from policies.origins import OriginError, parse_origin
from policies.report import Report, description, keys, mapping, string
from policies.source_doc import source
from policies.sources import VaultDatabaseSource
from policies.units import parse_rate

DATABASE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$-]{0,62}$")
TLS_MODES = ("disable", "require", "verify-full")
PURPOSE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
RESERVED_ENV = re.compile(r"^(PATH|HOME|SHELL|USER|PWD|LD_.*|PYTHON.*|.*_PROXY|VALETKEY_.*|PGUSER|PGHOST)$")


def postgres_upstream(doc: dict[str, Any], name: str, rule: str, r: Report) -> Upstream | None:
    """An upstream of ``protocol: postgres``; ``name`` already checked by the caller."""
    if not keys(doc, rule, {"version", "kind", "name", "protocol", "postgres", "source", "env", "purposes"},
                {"allow_private", "description", "run_limits"}, r) or not description(doc, rule, r):
        return None
    target = _target(doc["postgres"], f"{rule} postgres", r)
    env = _env(doc["env"], f"{rule} env", r)
    purposes = _purposes(doc["purposes"], rule, r)
    limits = run_limits(doc.get("run_limits", {}), f"{rule} run_limits", r)
    allow_private = doc.get("allow_private", False)
    if not isinstance(allow_private, bool):
        r.add(f"{rule} allow_private", "expected true or false", "write `allow_private: false`")
        return None
    if target is None or env is None or purposes is None or limits is None:
        return None
    origin = source(doc["source"], f"{rule} source", purposes, target.url, r)
    if origin is None:
        return None
    if not isinstance(origin, VaultDatabaseSource):
        r.add(f"{rule} source", f"a postgres upstream needs kind vault_database, not {origin.kind.value}",
              "write `source: {kind: vault_database, mount: database, roles: {read: ROLE}}`")
        return None
    return Upstream(
        name=name, base_url=target.url, scheme="postgresql", host=target.host, port=target.port,
        secret=None, injection=Injection(Placement.HEADER), env=env,
        purposes=MappingProxyType(purposes), allow_private=allow_private, run_limits=limits,
        source=r.file, credential_source=origin, protocol="postgres", postgres=target,
    )


def _target(value: Any, rule: str, r: Report) -> PostgresTarget | None:
    doc = mapping(value, rule, r)
    if doc is None or not keys(doc, rule, {"host", "database"}, {"port", "tls"}, r):
        return None
    host = string(doc["host"], f"{rule} host", r)
    database = string(doc["database"], f"{rule} database", r, DATABASE)
    port, tls = doc.get("port", 5432), doc.get("tls", "verify-full")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        r.add(f"{rule} port", f"{port!r} is not a port", "write e.g. `port: 5432`")
        return None
    if tls not in TLS_MODES:
        r.add(f"{rule} tls", f"{tls!r} is not one of {list(TLS_MODES)}",
              "write `tls: verify-full` (the database's certificate checked against "
              "VALETKEY_UPSTREAM_CA_FILE), `require`, or `disable` on a trusted network only")
        return None
    if host is None or database is None:
        return None
    try:
        origin = parse_origin(f"http://{host}:{port}")
    except OriginError as exc:
        r.add(f"{rule} host", exc.message, "write a DNS name or an IP address, without a port")
        return None
    return PostgresTarget(host=origin.host, port=port, database=database, tls=tls)


def _env(value: Any, rule: str, r: Report) -> SandboxEnv | None:
    doc = mapping(value, rule, r)
    if doc is None or not keys(doc, rule, {"placeholder", "base_url"}, set(), r):
        return None
    placeholder = string(doc["placeholder"], f"{rule} placeholder", r, ENV_NAME)
    url = string(doc["base_url"], f"{rule} base_url", r, ENV_NAME)
    if placeholder is None or url is None:
        return None
    for var in (placeholder, url):
        if RESERVED_ENV.fullmatch(var):
            r.add(rule, f"{var} is a variable the sandbox's tools rely on or the bundle sets",
                  "use PGPASSWORD for the placeholder and e.g. DATABASE_URL for the URL")
            return None
    if placeholder == url:
        r.add(rule, "placeholder and base_url name the same variable", "use two names")
        return None
    return SandboxEnv(placeholder=placeholder, base_url=url)


def _purposes(value: Any, rule: str, r: Report) -> dict[str, Purpose] | None:
    doc = mapping(value, f"{rule} purposes", r)
    if doc is None:
        return None
    if not doc:
        r.add(f"{rule} purposes", "no purposes", "declare at least one, e.g. `read:`")
        return None
    out: dict[str, Purpose] = {}
    for pname, body in doc.items():
        prule = f"{rule} purpose {pname}"
        if not isinstance(pname, str) or not PURPOSE_NAME.fullmatch(pname):
            r.add(prule, "purpose name must be lower-case letters, digits, '_'", "rename it")
            continue
        pdoc = mapping(body, prule, r)
        if pdoc is None or not keys(pdoc, prule, {"why"}, {"limits"}, r):
            continue
        why = pdoc["why"]
        if not isinstance(why, str) or len(why.strip().splitlines()) != 1:
            r.add(f"{prule} why", "needs a one-line reason", "write one sentence saying why it exists")
            continue
        rate = _rate(pdoc.get("limits", {}), f"{prule} limits", r)
        if rate is False:
            continue
        out[pname] = Purpose(name=pname, why=why.strip(), methods=frozenset(), paths=(), params=(),
                             limits=Limits(rate=rate if isinstance(rate, Rate) else None))
    return out if len(out) == len(doc) else None


def _rate(value: Any, rule: str, r: Report) -> Rate | bool | None:
    """The purpose's query rate, None without one, False after a problem."""
    doc = mapping(value, rule, r)
    if doc is None or not keys(doc, rule, set(), {"rate"}, r):
        return False
    if "rate" not in doc:
        return None
    try:
        return Rate(*parse_rate(doc["rate"]))
    except ValueError as exc:
        r.add(f"{rule} rate", str(exc), "write e.g. `rate: '600 per 1m'` (queries)")
        return False
