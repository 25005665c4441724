"""Validation of ``kind: upstream`` documents, field by field, into model objects.

Every function records problems in a ``Report`` and returns ``None`` for a document it could not
build; the loader raises only after all files are read, so one run shows every error.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

from policies.alerts_doc import run_limits
from policies.credential_names import is_credential_name, normalised
from policies.model import (
    Injection,
    Limits,
    Placement,
    Purpose,
    Rate,
    SandboxEnv,
    SecretRef,
    Upstream,
)
from policies.origins import Origin, OriginError, parse_origin
from policies.report import Report, description, keys, label, mapping, string
from policies.templates import PathTemplate, TemplateError
from policies.units import parse_rate, parse_size

NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
PURPOSE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
HEADER_NAME = re.compile(r"^[A-Za-z0-9-]+$")
# Headers that steer framing, routing or other credentials can never be an injection target.
RESERVED_HEADERS = re.compile(
    r"^(host|content-length|transfer-encoding|connection|keep-alive|te|trailer|upgrade|"
    r"proxy-.*|cookie|forwarded|x-forwarded-.*|x-original-url|x-rewrite-url)$", re.IGNORECASE)
# Variables the sandbox's own tooling reads: a placeholder must never shadow them.
RESERVED_ENV = re.compile(r"^(PATH|HOME|SHELL|USER|PWD|LD_.*|PYTHON.*|.*_PROXY|VALETKEY_.*)$")
KV_PATH = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
BASE_PATH = re.compile(r"^(/[A-Za-z0-9._-]+)+$")
QUERY_PARAM = re.compile(r"^[A-Za-z0-9_.-]+$")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
NEVER_METHODS = frozenset({"TRACE", "TRACK", "CONNECT"})


def _has_dot_segment(path: str) -> bool:
    return any(segment in (".", "..") for segment in path.split("/"))


def upstream(doc: dict[str, Any], r: Report) -> Upstream | None:
    rule = label("upstream", doc)
    known = keys(
        doc, rule,
        {"version", "kind", "name", "base_url", "secret", "inject", "env", "purposes"},
        {"allow_private", "description", "run_limits"}, r,
    )
    name = string(doc["name"], f"{rule} name", r, NAME) if "name" in doc else None
    if not known or name is None or not description(doc, rule, r):
        return None
    url = _base_url(doc["base_url"], f"{rule} base_url", r)
    secret = _secret(doc["secret"], f"{rule} secret", r)
    injection = _injection(doc["inject"], f"{rule} inject", r)
    env = _env(doc["env"], f"{rule} env", r)
    purposes = purpose_table(doc["purposes"], rule, r)
    allow_private = doc.get("allow_private", False)
    if not isinstance(allow_private, bool):
        r.add(f"{rule} allow_private", "expected true or false", "write `allow_private: false`")
        return None
    limits = run_limits(doc.get("run_limits", {}), f"{rule} run_limits", r)
    if url is None or secret is None or injection is None or env is None or purposes is None:
        return None
    if limits is None:
        return None
    return Upstream(
        name=name, base_url=url.url, scheme=url.scheme, host=url.host, port=url.port, secret=secret,
        injection=injection, env=env, purposes=MappingProxyType(purposes),
        allow_private=allow_private, run_limits=limits, source=r.file,
    )


def _base_url(value: Any, rule: str, r: Report) -> Origin | None:
    raw = string(value, rule, r)
    if raw is None:
        return None
    try:
        return parse_origin(raw)
    except OriginError as exc:
        r.add(rule, exc.message, exc.fix)
        return None


def _secret(value: Any, rule: str, r: Report) -> SecretRef | None:
    doc = mapping(value, rule, r)
    if doc is None or not keys(doc, rule, {"path", "field"}, {"mount"}, r):
        return None
    mount = string(doc.get("mount", "secret"), f"{rule} mount", r, KV_PATH)
    path = string(doc["path"], f"{rule} path", r, KV_PATH)
    field = string(doc["field"], f"{rule} field", r)
    if mount is None or path is None or field is None:
        return None
    if _has_dot_segment(mount) or _has_dot_segment(path):
        r.add(rule, "'.' or '..' segment in mount or path", "name the secret's path directly")
        return None
    return SecretRef(mount=mount, path=path, field=field)


def _injection(value: Any, rule: str, r: Report) -> Injection | None:
    doc = mapping(value, rule, r)
    if doc is None:
        return None
    if "header" in doc:
        if not keys(doc, rule, {"header"}, {"format", "accept"}, r):
            return None
        pair = _header_format(doc, rule, r)
        accept = _accept(doc.get("accept", []), f"{rule} accept", r)
        if pair is None or accept is None:
            return None
        return Injection(Placement.HEADER, header=pair[0], format=pair[1], accept=accept)
    if "basic" in doc:
        if not keys(doc, rule, {"basic"}, set(), r):
            return None
        basic = mapping(doc["basic"], f"{rule} basic", r)
        if basic is None or not keys(basic, f"{rule} basic", {"username"}, set(), r):
            return None
        user = string(basic["username"], f"{rule} basic username", r)
        if user is None:
            return None
        if ":" in user or not (user.isascii() and user.isprintable()):
            r.add(f"{rule} basic username", f"{user!r} contains ':' or a control character",
                  "fix the username")
            return None
        return Injection(Placement.BASIC, username=user)
    if "query" in doc:
        if not keys(doc, rule, {"query"}, set(), r):
            return None
        param = string(doc["query"], f"{rule} query", r, QUERY_PARAM)
        return None if param is None else Injection(Placement.QUERY, param=param)
    if not keys(doc, rule, set(), {"header", "format", "accept", "basic", "query"}, r):
        return None  # an unknown key such as `hedaer:` is named with a did-you-mean
    r.add(rule, "no placement", "give exactly one of `header:`, `basic:` or `query:`")
    return None


def _accept(value: Any, rule: str, r: Report) -> tuple[tuple[str, str], ...] | None:
    if not isinstance(value, list) or not all(isinstance(a, dict) and "accept" not in a for a in value):
        r.add(rule, "expected a list of {header, format}",
              "e.g. `accept: [{header: Authorization, format: 'Bearer {secret}'}]`")
        return None
    pairs = [_header_format(a, f"{rule}[{i}]", r) for i, a in enumerate(value)]
    return None if None in pairs else tuple(p for p in pairs if p is not None)


def _header_format(doc: dict[str, Any], rule: str, r: Report) -> tuple[str, str] | None:
    """A credential header and its value format: where a placeholder may be read or injected."""
    if set(doc) - {"header", "format", "accept"} or "header" not in doc:
        r.add(rule, "expected header and an optional format", "write `{header: X, format: '... {secret}'}`")
        return None
    header = string(doc["header"], f"{rule} header", r, HEADER_NAME)
    fmt = string(doc.get("format", "{secret}"), f"{rule} format", r)
    if header is not None and RESERVED_HEADERS.fullmatch(header):
        r.add(f"{rule} header", f"{header!r} is a framing, routing or cookie header",
              "inject into the upstream's credential header, e.g. Authorization")
        return None
    if header is None or fmt is None or not _format_ok(fmt, f"{rule} format", r):
        return None
    return header, fmt


def _format_ok(fmt: str, rule: str, r: Report) -> bool:
    if fmt.count("{secret}") != 1:
        r.add(rule, f"{fmt!r} must contain {{secret}} exactly once", "write e.g. 'Bearer {secret}'")
        return False
    rest = fmt.replace("{secret}", "")
    # A stray brace breaks str.format; CR/LF would let the value start a new header line.
    if "{" in rest or "}" in rest or not (fmt.isascii() and fmt.isprintable()):
        r.add(rule, f"{fmt!r} has a stray brace or a non-printable character",
              "write printable ASCII around one {secret}, e.g. 'Bearer {secret}'")
        return False
    return True


def _env(value: Any, rule: str, r: Report) -> SandboxEnv | None:
    doc = mapping(value, rule, r)
    if doc is None or not keys(doc, rule, {"placeholder", "base_url"}, {"base_path"}, r):
        return None
    placeholder = string(doc["placeholder"], f"{rule} placeholder", r, ENV_NAME)
    base_url = string(doc["base_url"], f"{rule} base_url", r, ENV_NAME)
    base_path = doc.get("base_path", "")
    if not isinstance(base_path, str) or (base_path and (
        not BASE_PATH.fullmatch(base_path) or _has_dot_segment(base_path)
    )):
        r.add(f"{rule} base_path", f"{base_path!r} is not a path like /v1", "write e.g. `/v1`")
        return None
    if placeholder is None or base_url is None:
        return None
    for var in (placeholder, base_url):
        if RESERVED_ENV.fullmatch(var.upper()):
            r.add(rule, f"{var} is a variable the sandbox's tools rely on",
                  "name the upstream's own variable, e.g. OPENAI_API_KEY")
            return None
    if placeholder == base_url:
        r.add(rule, "placeholder and base_url name the same variable", "use two names")
        return None
    return SandboxEnv(placeholder=placeholder, base_url=base_url, base_path=base_path)


def purpose_table(value: Any, rule: str, r: Report) -> dict[str, Purpose] | None:
    doc = mapping(value, f"{rule} purposes", r)
    if doc is None:
        return None
    if not doc:
        r.add(f"{rule} purposes", "no purposes", "declare at least one purpose")
        return None
    out: dict[str, Purpose] = {}
    for pname, body in doc.items():
        prule = f"{rule} purpose {pname}"
        if not isinstance(pname, str) or not PURPOSE_NAME.fullmatch(pname):
            r.add(prule, "purpose name must be lower-case letters, digits, '_'", "rename it")
            continue
        purpose = _purpose(pname, body, prule, r)
        if purpose is not None:
            out[pname] = purpose
    return out if len(out) == len(doc) else None


def _purpose(name: str, value: Any, rule: str, r: Report) -> Purpose | None:
    doc = mapping(value, rule, r)
    optional = {"params", "limits", "allow_fields"}
    if doc is None or not keys(doc, rule, {"why", "methods", "paths"}, optional, r):
        return None
    why = doc["why"]
    if not isinstance(why, str) or len(why.strip().splitlines()) != 1:
        r.add(f"{rule} why", "needs a one-line reason", "write one sentence saying why it exists")
        return None
    methods = doc["methods"]
    if not isinstance(methods, list) or not methods or not all(isinstance(m, str) for m in methods):
        r.add(f"{rule} methods", "expected a non-empty list of HTTP methods", "e.g. `[GET]`")
        return None
    upper = frozenset(m.upper() for m in methods)
    if upper & NEVER_METHODS or not upper <= METHODS:
        r.add(f"{rule} methods", f"unsupported methods {sorted(upper - METHODS)}",
              f"use only {sorted(METHODS)}")
        return None
    paths_raw = doc["paths"]
    if not isinstance(paths_raw, list) or not paths_raw:
        r.add(f"{rule} paths", "expected a non-empty list of path templates", "e.g. ['/v1/x']")
        return None
    paths: list[PathTemplate] = []
    for i, raw in enumerate(paths_raw):
        try:
            paths.append(PathTemplate.parse(str(raw)))
        except TemplateError as exc:
            r.add(f"{rule} paths[{i}]", str(exc), "name a concrete path with {param} segments")
    params = doc.get("params", [])
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        r.add(f"{rule} params", "expected a list of parameter names", "e.g. `[owner, repo]`")
        return None
    known = {p for t in paths for p in t.params}
    # Only when every template parsed: a broken one would make its parameters look unknown.
    for p in params if len(paths) == len(paths_raw) else []:
        if p not in known:
            r.add(f"{rule} params", f"{p!r} appears in no path template", "remove it or use it")
    limits = _limits(doc.get("limits", {}), f"{rule} limits", r)
    allow_fields = _allow_fields(doc.get("allow_fields", []), f"{rule} allow_fields", r)
    if len(paths) != len(paths_raw) or limits is None or not set(params) <= known:
        return None
    if allow_fields is None:
        return None
    return Purpose(name=name, why=why.strip(), methods=upper, paths=tuple(paths),
                   params=tuple(params), limits=limits, allow_fields=allow_fields)


def _allow_fields(value: Any, rule: str, r: Report) -> frozenset[str] | None:
    """Credential-named fields the purpose may send: each must be a name the gateway would refuse
    (anything else is a typo or a no-op)."""
    if not isinstance(value, list) or not all(isinstance(f, str) and f.strip() for f in value):
        r.add(rule, "expected a list of field names", "e.g. `allow_fields: [password]`")
        return None
    ok = True
    for name in value:
        if not is_credential_name(name, flat=True):
            r.add(rule, f"{name!r} is not a credential-named field; the gateway never refuses it",
                  "remove it (see docs/policy.md, credential-named fields)")
            ok = False
    return frozenset(normalised(f) for f in value) if ok else None


def _limits(value: Any, rule: str, r: Report) -> Limits | None:
    doc = mapping(value, rule, r)
    if doc is None or not keys(doc, rule, set(), {"max_body", "rate"}, r):
        return None
    max_body: int | None = None
    rate: Rate | None = None
    ok = True
    if "max_body" in doc:
        try:
            max_body = parse_size(doc["max_body"])
        except ValueError as exc:
            r.add(f"{rule} max_body", str(exc), "write e.g. `max_body: 64KiB`")
            ok = False
    if "rate" in doc:
        try:
            rate = Rate(*parse_rate(doc["rate"]))
        except ValueError as exc:
            r.add(f"{rule} rate", str(exc), "write e.g. `rate: '3 per 10m'`")
            ok = False
    return Limits(max_body=max_body, rate=rate) if ok else None
