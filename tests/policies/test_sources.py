"""The ``source:`` block: a valid block of each kind, and one broken edit per case with its rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.load import PolicyLoadError, load_policy_dir
from policies.sources import (
    GitHubAppSource,
    KvSource,
    OAuth2Source,
    OAuthGrant,
    SourceKind,
    VaultDatabaseSource,
    vault_access,
)
from tests.policies.test_checks import RUNTIME, UPSTREAM, edit

SECRET = "secret: {path: fixtures/demo, field: token}\n"
GITHUB = """source:
  kind: github_app
  app_id: 123
  installation_id: "456"
  private_key: {transit: {key: gh-app}}
  permissions:
    read_item: {contents: read, issues: write}
"""
OAUTH = """source:
  kind: oauth2
  token_url: https://auth.example.com/token
  grant: refresh_token
  client: {path: oauth/demo}
  refresh_token: {path: oauth/grant, field: refresh_token}
"""
DATABASE = """source:
  kind: vault_database
  roles: {read_item: demo-ro}
"""
GH_UPSTREAM = UPSTREAM.replace(SECRET, GITHUB).replace("params: [item]", "params: [repo]").replace(
    "/v1/items/{item}", "/repos/{repo}")


def load(tmp_path: Path, upstream: str) -> object:
    (tmp_path / "upstream.yaml").write_text(upstream)
    (tmp_path / "runtime.yaml").write_text(RUNTIME)
    return load_policy_dir(tmp_path).upstreams["demo"]


def test_no_source_is_kv(tmp_path: Path) -> None:
    up = load(tmp_path, UPSTREAM)
    assert up.credential_source == KvSource()  # type: ignore[attr-defined]


def test_github_app(tmp_path: Path) -> None:
    up = load(tmp_path, GH_UPSTREAM)
    source = up.credential_source  # type: ignore[attr-defined]
    assert isinstance(source, GitHubAppSource)
    assert (source.app_id, source.installation_id, source.api_url) == ("123", "456", "https://api.example.com")
    assert source.transit_key is not None
    assert source.transit_key.key == "gh-app"
    assert dict(source.permissions["read_item"]) == {"contents": "read", "issues": "write"}
    assert up.secret is None  # type: ignore[attr-defined]
    assert vault_access(source, None) == (("transit/sign/gh-app", '["update"]'),)


def test_oauth2_and_database(tmp_path: Path) -> None:
    source = load(tmp_path, UPSTREAM.replace(SECRET, OAUTH)).credential_source  # type: ignore[attr-defined]
    assert isinstance(source, OAuth2Source)
    assert source.grant is OAuthGrant.REFRESH_TOKEN
    assert [p for p, _ in vault_access(source, None)] == ["secret/data/oauth/demo", "secret/data/oauth/grant"]
    source = load(tmp_path, UPSTREAM.replace(SECRET, DATABASE)).credential_source  # type: ignore[attr-defined]
    assert isinstance(source, VaultDatabaseSource)
    assert (source.mount, dict(source.roles), source.kind) == ("database", {"read_item": "demo-ro"},
                                                                SourceKind.VAULT_DATABASE)


BROKEN = [
    pytest.param(UPSTREAM, SECRET, "", "upstream demo", "missing key 'secret'", id="kv-without-secret"),
    pytest.param(UPSTREAM, SECRET, SECRET + "source: {kind: vault}\n", "source kind", "unknown source kind",
                 id="unknown-kind"),
    pytest.param(UPSTREAM, SECRET, SECRET + DATABASE, "upstream demo secret", "no KV secret is read",
                 id="secret-with-source"),
    pytest.param(GH_UPSTREAM, "app_id: 123", "app_id: abc", "source app_id", "does not match",
                 id="app-id-not-numeric"),
    pytest.param(GH_UPSTREAM, "{transit: {key: gh-app}}",
                 "{transit: {key: gh-app}, kv: {path: a, field: b}}", "source private_key",
                 "exactly one of", id="two-private-keys"),
    pytest.param(GH_UPSTREAM, "read_item: {contents: read", "read_items: {contents: read",
                 "source permissions read_items", "not a purpose", id="permission-of-unknown-purpose"),
    pytest.param(GH_UPSTREAM, "issues: write", "issues: owner", "source permissions read_item issues",
                 "not a GitHub permission", id="bad-permission-level"),
    pytest.param(GH_UPSTREAM, "  private_key:", "  repository_param: name\n  private_key:",
                 "source repository_param", "no purpose binds", id="repository-param-unbound"),
    pytest.param(UPSTREAM.replace(SECRET, OAUTH), "grant: refresh_token", "grant: password",
                 "source grant", "unknown grant", id="oauth-unknown-grant"),
    pytest.param(UPSTREAM.replace(SECRET, OAUTH), "  refresh_token: {path: oauth/grant, field: refresh_token}\n",
                 "", "source", "needs `refresh_token:`", id="refresh-grant-without-token"),
    pytest.param(UPSTREAM.replace(SECRET, OAUTH), "https://auth.example.com/token", "ftp://x/token",
                 "source token_url", "not an http(s) URL", id="oauth-token-url-scheme"),
    pytest.param(UPSTREAM.replace(SECRET, OAUTH), "{path: oauth/demo}", "{path: ../demo}",
                 "source client", "'.' or '..'", id="oauth-client-dotdot"),
    pytest.param(UPSTREAM.replace(SECRET, DATABASE), "{read_item: demo-ro}", "{write_item: demo-rw}",
                 "source roles write_item", "not a purpose", id="database-role-of-unknown-purpose"),
    pytest.param(UPSTREAM.replace(SECRET, DATABASE), "  roles:", "  role:", "source",
                 "unknown key 'role'", id="database-typo"),
]


@pytest.mark.parametrize(("base", "old", "new", "rule", "message"), BROKEN)
def test_broken_source(tmp_path: Path, base: str, old: str, new: str, rule: str, message: str) -> None:
    with pytest.raises(PolicyLoadError) as info:
        load(tmp_path, edit(base, old, new))
    problems = info.value.problems
    assert len(problems) >= 1, problems
    assert rule in problems[0].rule, problems
    assert message in problems[0].message, problems
    assert problems[0].fix.strip()
