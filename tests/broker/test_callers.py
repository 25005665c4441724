"""Mapping Vault token lookups to runtimes: a pure table, then real AppRole and policy tokens."""

from __future__ import annotations

from typing import Any

import pytest

from broker.callers import caller_token, identify
from contract.errors import Unauthenticated
from policies.model import PolicySet

ADMIN = "valetkey-admin"

IDENTITIES = [
    pytest.param({"policies": ["default", "valetkey-runtime-notifier"]}, "notifier", False,
                 id="token-policy"),
    pytest.param({"policies": ["default"], "identity_policies": ["valetkey-runtime-notifier"]},
                 "notifier", False, id="identity-policy"),
    pytest.param({"policies": ["default"], "path": "auth/approle/login",
                  "meta": {"role_name": "valetkey-runtime-coding-agent"}}, "coding-agent", False,
                 id="approle-role"),
    pytest.param({"policies": [ADMIN]}, "admin:", True, id="admin"),
    pytest.param({"policies": [ADMIN, "valetkey-runtime-notifier"]}, "notifier", True,
                 id="admin-and-runtime"),
]


@pytest.mark.parametrize(("info", "name", "admin"), IDENTITIES)
def test_identify(shipped_policies: PolicySet, info: dict[str, Any], name: str, admin: bool) -> None:
    caller = identify(info, shipped_policies, ADMIN)
    assert caller.name.startswith(name)
    assert caller.is_admin is admin


REFUSED = [
    pytest.param({"policies": ["default"]}, "unknown_caller", id="no-mapping"),
    pytest.param({"policies": ["root"]}, "unknown_caller", id="root-is-not-a-runtime"),
    pytest.param({"policies": ["default"], "path": "auth/token/create",
                  "meta": {"role_name": "valetkey-runtime-coding-agent"}}, "unknown_caller",
                 id="role-name-meta-forged-on-plain-token"),
    pytest.param({"policies": ["valetkey-runtime-notifier"], "path": "auth/approle/login",
                  "meta": {"role_name": "valetkey-runtime-coding-agent"}}, "ambiguous_caller",
                 id="two-runtimes"),
]


@pytest.mark.parametrize(("info", "code"), REFUSED)
def test_identify_refuses(shipped_policies: PolicySet, info: dict[str, Any], code: str) -> None:
    with pytest.raises(Unauthenticated) as raised:
        identify(info, shipped_policies, ADMIN)
    assert raised.value.code == code


HEADERS = [
    pytest.param({"x-vault-token": "hvs.abc"}, "hvs.abc", id="x-vault-token"),
    pytest.param({"authorization": "Bearer hvs.abc"}, "hvs.abc", id="bearer"),
    pytest.param({"authorization": "bearer   hvs.abc "}, "hvs.abc", id="bearer-case-space"),
]


@pytest.mark.parametrize(("headers", "token"), HEADERS)
def test_caller_token(headers: dict[str, str], token: str) -> None:
    assert caller_token(headers) == token


@pytest.mark.parametrize("headers", [
    pytest.param({}, id="none"),
    pytest.param({"authorization": "Basic abc"}, id="basic"),
    pytest.param({"x-vault-token": "a\x00b"}, id="control-char"),
    pytest.param({"x-vault-token": "é"}, id="non-ascii"),
])
def test_caller_token_refused(headers: dict[str, str]) -> None:
    with pytest.raises(Unauthenticated):
        caller_token(headers)
