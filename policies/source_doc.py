"""Validation of an upstream's ``source:`` block into a ``policies.sources`` object.

Checked against the upstream's purposes: a GitHub App permission or a database role named for a
purpose the upstream does not declare is an error, as is a repository parameter no purpose binds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from policies.model import Purpose
from policies.origins import OriginError, parse_origin
from policies.report import Report, keys, mapping, string
from policies.sources import (
    CredentialSource,
    GitHubAppSource,
    KvPath,
    KvSource,
    OAuth2Source,
    OAuthGrant,
    SecretRef,
    SourceKind,
    TransitRef,
    VaultDatabaseSource,
)

KV_PATH = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
NUMERIC_ID = re.compile(r"^[0-9]{1,20}$")
PARAM = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# GitHub's permission names are snake_case words (contents, pull_requests, metadata, ...)
GITHUB_PERMISSION = re.compile(r"^[a-z][a-z_]{1,62}$")
GITHUB_LEVELS = frozenset({"read", "write", "admin"})
VAULT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
KINDS = ", ".join(k.value for k in SourceKind)


def source(value: Any, rule: str, purposes: Mapping[str, Purpose], base_url: str,
           r: Report) -> CredentialSource | None:
    """The ``source:`` block (``rule`` names it); absent means ``kind: kv``."""
    doc = mapping(value, rule, r)
    if doc is None:
        return None
    kind = doc.get("kind", SourceKind.KV.value)
    if kind not in {k.value for k in SourceKind}:
        r.add(f"{rule} kind", f"unknown source kind {kind!r}", f"use one of: {KINDS}")
        return None
    parse = _PARSERS[SourceKind(kind)]
    return parse(doc, rule, purposes, base_url, r)


def _kv(doc: dict[str, Any], rule: str, purposes: Mapping[str, Purpose], base_url: str,
        r: Report) -> CredentialSource | None:
    return KvSource() if keys(doc, rule, set(), {"kind"}, r) else None


def _github_app(doc: dict[str, Any], rule: str, purposes: Mapping[str, Purpose], base_url: str,
                r: Report) -> CredentialSource | None:
    if not keys(doc, rule, {"kind", "app_id", "installation_id", "private_key", "permissions"},
                {"api_url", "repository_param"}, r):
        return None
    app_id = _numeric(doc["app_id"], f"{rule} app_id", r)
    installation = _numeric(doc["installation_id"], f"{rule} installation_id", r)
    api_url = _url(doc.get("api_url", base_url), f"{rule} api_url", r)
    param = string(doc.get("repository_param", "repo"), f"{rule} repository_param", r, PARAM)
    key = _private_key(doc["private_key"], f"{rule} private_key", r)
    permissions = _permissions(doc["permissions"], f"{rule} permissions", purposes, r)
    if app_id is None or installation is None or api_url is None or param is None:
        return None
    if key is None or permissions is None:
        return None
    if not any(param in p.params for p in purposes.values()):
        r.add(f"{rule} repository_param", f"no purpose binds a {param!r} parameter",
              "name the grant parameter that holds the repository, e.g. `repo`")
        return None
    transit, kv = key
    return GitHubAppSource(app_id=app_id, installation_id=installation, api_url=api_url,
                           transit_key=transit, private_key=kv, repository_param=param,
                           permissions=permissions)


def _numeric(value: Any, rule: str, r: Report) -> str | None:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    return string(text, rule, r, NUMERIC_ID)


def _url(value: Any, rule: str, r: Report) -> str | None:
    raw = string(value, rule, r)
    if raw is None:
        return None
    try:
        return parse_origin(raw).url
    except OriginError as exc:
        r.add(rule, exc.message, exc.fix)
        return None


def _private_key(value: Any, rule: str, r: Report) -> tuple[TransitRef | None, SecretRef | None] | None:
    doc = mapping(value, rule, r)
    if doc is None or not keys(doc, rule, set(), {"transit", "kv"}, r):
        return None
    if len(doc) != 1:
        r.add(rule, "give exactly one of `transit:` or `kv:`",
              "prefer `transit: {mount: transit, key: NAME}` (the key never leaves Vault)")
        return None
    if "transit" in doc:
        t = mapping(doc["transit"], f"{rule} transit", r)
        if t is None or not keys(t, f"{rule} transit", {"key"}, {"mount"}, r):
            return None
        mount = string(t.get("mount", "transit"), f"{rule} transit mount", r, KV_PATH)
        name = string(t["key"], f"{rule} transit key", r, VAULT_NAME)
        return None if mount is None or name is None else (TransitRef(mount, name), None)
    ref = secret_ref(doc["kv"], f"{rule} kv", r)
    return None if ref is None else (None, ref)


def secret_ref(value: Any, rule: str, r: Report) -> SecretRef | None:
    doc = mapping(value, rule, r)
    if doc is None or not keys(doc, rule, {"path", "field"}, {"mount"}, r):
        return None
    path = kv_path(doc, rule, r)
    field = string(doc["field"], f"{rule} field", r)
    return None if path is None or field is None else SecretRef(path.mount, path.path, field)


def kv_path(doc: dict[str, Any], rule: str, r: Report) -> KvPath | None:
    mount = string(doc.get("mount", "secret"), f"{rule} mount", r, KV_PATH)
    path = string(doc.get("path"), f"{rule} path", r, KV_PATH)
    if mount is None or path is None:
        return None
    if any(s in (".", "..") for s in f"{mount}/{path}".split("/")):
        r.add(rule, "'.' or '..' segment in mount or path", "name the secret's path directly")
        return None
    return KvPath(mount, path)


def _permissions(value: Any, rule: str, purposes: Mapping[str, Purpose],
                 r: Report) -> Mapping[str, Mapping[str, str]] | None:
    doc = mapping(value, rule, r)
    if doc is None:
        return None
    out: dict[str, Mapping[str, str]] = {}
    ok = True
    for purpose, perms in doc.items():
        prule = f"{rule} {purpose}"
        if purpose not in purposes:
            r.add(prule, f"{purpose!r} is not a purpose of this upstream", "name a declared purpose")
            ok = False
            continue
        body = mapping(perms, prule, r)
        if body is None:
            ok = False
            continue
        for name, level in body.items():
            if (not isinstance(name, str) or not GITHUB_PERMISSION.fullmatch(name)
                    or level not in GITHUB_LEVELS):
                r.add(f"{prule} {name}", f"{name!r}: {level!r} is not a GitHub permission and level",
                      "write e.g. `{contents: read, issues: write}`")
                ok = False
        out[purpose] = MappingProxyType(dict(body))
    return MappingProxyType(out) if ok else None


def _oauth2(doc: dict[str, Any], rule: str, purposes: Mapping[str, Purpose], base_url: str,
            r: Report) -> CredentialSource | None:
    if not keys(doc, rule, {"kind", "token_url", "grant", "client"}, {"refresh_token", "scope"}, r):
        return None
    token_url = string(doc["token_url"], f"{rule} token_url", r)
    if token_url is not None and not token_url.startswith(("https://", "http://")):
        r.add(f"{rule} token_url", f"{token_url!r} is not an http(s) URL", "give the token endpoint")
        token_url = None
    grant = doc["grant"]
    if grant not in {g.value for g in OAuthGrant}:
        r.add(f"{rule} grant", f"unknown grant {grant!r}", "use client_credentials or refresh_token")
        return None
    client_doc = mapping(doc["client"], f"{rule} client", r)
    client = None
    if client_doc is not None and keys(client_doc, f"{rule} client", {"path"}, {"mount"}, r):
        client = kv_path(client_doc, f"{rule} client", r)
    refresh: SecretRef | None = None
    if grant == OAuthGrant.REFRESH_TOKEN:
        if "refresh_token" not in doc:
            r.add(rule, "the refresh_token grant needs `refresh_token:`",
                  "say where the delegated grant's refresh token is: {mount, path, field}")
            return None
        refresh = secret_ref(doc["refresh_token"], f"{rule} refresh_token", r)
        if refresh is None:
            return None
    elif "refresh_token" in doc:
        r.add(f"{rule} refresh_token", "only the refresh_token grant reads a refresh token",
              "remove it or set `grant: refresh_token`")
        return None
    scope = doc.get("scope", "")
    if not isinstance(scope, str) or not scope.isprintable():
        r.add(f"{rule} scope", "expected a space-separated string", "e.g. `scope: 'read write'`")
        return None
    if token_url is None or client is None:
        return None
    return OAuth2Source(token_url=token_url, grant=OAuthGrant(grant), client=client,
                        refresh_token=refresh, scope=scope)


def _vault_database(doc: dict[str, Any], rule: str, purposes: Mapping[str, Purpose], base_url: str,
                    r: Report) -> CredentialSource | None:
    if not keys(doc, rule, {"kind", "roles"}, {"mount"}, r):
        return None
    mount = string(doc.get("mount", "database"), f"{rule} mount", r, KV_PATH)
    roles = mapping(doc["roles"], f"{rule} roles", r)
    if mount is None or roles is None:
        return None
    ok = True
    for purpose, role in roles.items():
        if purpose not in purposes:
            r.add(f"{rule} roles {purpose}", f"{purpose!r} is not a purpose of this upstream",
                  "name a declared purpose")
            ok = False
        elif string(role, f"{rule} roles {purpose}", r, VAULT_NAME) is None:
            ok = False
    if ok and not roles:
        r.add(f"{rule} roles", "no roles", "map each purpose to a Vault database role")
        ok = False
    return VaultDatabaseSource(mount=mount, roles=MappingProxyType(dict(roles))) if ok else None


_PARSERS: dict[SourceKind, Callable[[dict[str, Any], str, Mapping[str, Purpose], str, Report],
                                    CredentialSource | None]] = {
    SourceKind.KV: _kv,
    SourceKind.GITHUB_APP: _github_app,
    SourceKind.OAUTH2: _oauth2,
    SourceKind.VAULT_DATABASE: _vault_database,
}
