"""The proxy token's grants: ``<name>/<purpose>``, and reading back those of one name."""

from __future__ import annotations

import pytest

from contract.claims import GrantClaim, grants_at, params_view, proxy_purpose

GRANTS = tuple(GrantClaim(p, params_view(params)) for p, params in [
    ("pypi/connect", {}), ("openai/chat", {}), ("github-codeload/download", {"owner": "a", "repo": "b"}),
    ("github-codeload/download", {"owner": "c", "repo": "d"}), ("github/read_repo", {"owner": "a", "repo": "b"}),
    ("chat", {}), ("openai/", {}),
])


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("pypi", [("connect", {})], id="tunnel"),
        pytest.param("openai", [("chat", {})], id="upstream-empty-purpose-skipped"),
        pytest.param("github-codeload", [("download", {"owner": "a", "repo": "b"}),
                                         ("download", {"owner": "c", "repo": "d"})], id="params-kept"),
        pytest.param("github", [("read_repo", {"owner": "a", "repo": "b"})], id="no-prefix-confusion"),
        pytest.param("py", [], id="name-prefix-is-not-a-match"),
        pytest.param("chat", [], id="an-upstream-token-purpose-is-no-proxy-grant"),
    ],
)
def test_grants_at(name: str, expected: list[tuple[str, dict[str, str]]]) -> None:
    assert [(g.purpose, dict(g.params)) for g in grants_at(GRANTS, name)] == expected


def test_proxy_purpose() -> None:
    assert proxy_purpose("pypi", "connect") == "pypi/connect"
