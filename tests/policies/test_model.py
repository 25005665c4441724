"""Small behaviours of the model objects the broker and gateways rely on."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from policies.model import Identity, Injection, Placement, Rate, Runtime, SecretRef


@pytest.mark.parametrize(
    ("injection", "names"),
    [
        pytest.param(Injection(Placement.HEADER, header="X-Api-Key"), {"x-api-key"}, id="header"),
        pytest.param(Injection(Placement.BASIC, username="git"), {"authorization"}, id="basic"),
        pytest.param(Injection(Placement.QUERY, param="appid"), set(), id="query"),
    ],
)
def test_header_names(injection: Injection, names: set[str]) -> None:
    assert injection.header_names() == names


def test_secret_ref_api_path() -> None:
    assert SecretRef("secret", "valetkey/upstreams/github", "token").api_path == (
        "secret/data/valetkey/upstreams/github"
    )


def test_rate_str() -> None:
    assert str(Rate(3, 600)) == "3 per 600s"


@pytest.mark.parametrize(
    ("upstream", "purpose", "granted"),
    [
        pytest.param("github", "read_issues", True, id="granted"),
        pytest.param("github", "push", False, id="other-purpose"),
        pytest.param("slack", "read_issues", False, id="other-upstream"),
    ],
)
def test_may_grant(upstream: str, purpose: str, granted: bool) -> None:
    runtime = Runtime(
        name="agent", identity=Identity(vault_policy="p"),
        allow=MappingProxyType({"github": frozenset({"read_issues"})}), max_ttl=60, max_grants=1,
    )

    assert runtime.may_grant(upstream, purpose) is granted
