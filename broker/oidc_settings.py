"""The console's OpenID Connect sign-in settings, read once with the rest of ``BrokerSettings``.

=====================================  ==============================================================
variable                               meaning
=====================================  ==============================================================
VALETKEY_CONSOLE_OIDC_ISSUER           the provider's issuer URL; unset: no OIDC sign-in. https, or
                                       http on a loopback address (dev and tests)
VALETKEY_CONSOLE_OIDC_CLIENT_ID        the console's client id at the provider
VALETKEY_CONSOLE_OIDC_CLIENT_SECRET    its secret, or ``…_SECRET_FILE`` (a file holding it), or
                                       ``…_SECRET_VAULT`` = ``mount/path#field`` (KV v2, read with
                                       the broker's Vault token on first use)
VALETKEY_CONSOLE_OIDC_REDIRECT_URL     the console's public callback,
                                       ``https://<console>/console/oidc/callback``
VALETKEY_CONSOLE_OIDC_GROUPS_CLAIM     the ID token claim listing the user's groups (``groups``)
VALETKEY_CONSOLE_OIDC_ADMIN_GROUPS     provider groups whose members are the security team (comma)
VALETKEY_CONSOLE_OIDC_APPROVER_GROUPS  ``provider-group=approver-group,…``: members decide that
                                       approver group's approvals
=====================================  ==============================================================

Anyone the provider signs in who is in none of these groups is refused (``not_approver``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from contract.env import SettingsError, checked_url, required
from contract.secret import Secret

PREFIX = "VALETKEY_CONSOLE_OIDC_"


@dataclass(frozen=True)
class OIDCSettings:
    issuer: str
    client_id: str
    redirect_url: str
    client_secret: Secret = field(default_factory=lambda: Secret(""))
    secret_vault: tuple[str, str, str] | None = None  # (mount, path, field)
    groups_claim: str = "groups"
    admin_groups: frozenset[str] = frozenset()
    approver_groups: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OIDCSettings | None:
        issuer = env.get(PREFIX + "ISSUER", "")
        if not issuer:
            return None
        _secure_url(PREFIX + "ISSUER", issuer)
        secret, vault = _secret(env)
        admins = frozenset(filter(None, (g.strip() for g in env.get(PREFIX + "ADMIN_GROUPS", "").split(","))))
        approvers = _pairs(env.get(PREFIX + "APPROVER_GROUPS", ""))
        if not admins and not approvers:
            raise SettingsError(f"{PREFIX}ADMIN_GROUPS or {PREFIX}APPROVER_GROUPS must name a group: "
                                "otherwise nobody the provider signs in may use the console")
        return cls(issuer=issuer.rstrip("/"), client_id=required(env, PREFIX + "CLIENT_ID"),
                   redirect_url=_secure_url(PREFIX + "REDIRECT_URL", required(env, PREFIX + "REDIRECT_URL")),
                   client_secret=secret, secret_vault=vault,
                   groups_claim=env.get(PREFIX + "GROUPS_CLAIM", "groups") or "groups",
                   admin_groups=admins, approver_groups=MappingProxyType(approvers))


def _secure_url(key: str, value: str) -> str:
    checked = checked_url(key, value)
    host = urlsplit(checked).hostname or ""
    if urlsplit(checked).scheme == "http" and host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise SettingsError(f"{key} must be https (http only on a loopback address)")
    return checked


def _secret(env: Mapping[str, str]) -> tuple[Secret, tuple[str, str, str] | None]:
    given = [k for k in ("CLIENT_SECRET", "CLIENT_SECRET_FILE", "CLIENT_SECRET_VAULT") if env.get(PREFIX + k)]
    if len(given) != 1:
        raise SettingsError(f"set exactly one of {PREFIX}CLIENT_SECRET, …_FILE, …_VAULT")
    value = env[PREFIX + given[0]]
    if given[0] == "CLIENT_SECRET":
        return Secret(value), None
    if given[0] == "CLIENT_SECRET_FILE":
        try:
            return Secret(Path(value).read_text().strip()), None
        except OSError as exc:
            raise SettingsError(f"{PREFIX}CLIENT_SECRET_FILE cannot be read ({type(exc).__name__})") from None
    ref, _, fld = value.partition("#")
    mount, _, path = ref.partition("/")
    if not (mount and path and fld):
        raise SettingsError(f"{PREFIX}CLIENT_SECRET_VAULT is not mount/path#field")
    return Secret(""), (mount, path, fld)


def _pairs(raw: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        theirs, sep, ours = item.partition("=")
        if not sep or not theirs.strip() or not ours.strip():
            raise SettingsError(f"{PREFIX}APPROVER_GROUPS: {item!r} is not provider-group=approver-group")
        out[theirs.strip()] = ours.strip()
    return out
