"""GitHub App tokens: what a run's token is narrowed to (a table of grants), and the demo
installation's checks of the App JWT and of a token request, as GitHub answers them."""

from __future__ import annotations

import time
from types import MappingProxyType

import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from contract.claims import AccessClaims, GrantClaim
from gateways.sources.github_app import narrowed
from gateways.sources.prewarm import claims_of
from policies.sources import GitHubAppSource
from valetkey.dev.demo.github_app import AppInstallation

CONFIG = GitHubAppSource(app_id="1", installation_id="2", api_url="https://api.github.com", transit_key=None,
                         private_key=None, permissions=MappingProxyType({
                             "read_repo": {"contents": "read"}, "push": {"contents": "write"},
                             "comment": {"issues": "write", "contents": "read"}}))


def run(*grants: tuple[str, dict[str, str]]) -> AccessClaims:
    return AccessClaims(iss="i", sub="r", aud="a", exp=0, nbf=0, iat=0, jti="j", client_id="c",
                        grants=tuple(GrantClaim(p, params) for p, params in grants))


@pytest.mark.parametrize(("claims", "repos", "perms"), [
    pytest.param(run(("read_repo", {"repo": "widgets"})), ["widgets"], {"contents": "read"}, id="one-repo-read"),
    pytest.param(run(("read_repo", {"repo": "widgets"}), ("push", {"repo": "widgets.git"})), ["widgets"],
                 {"contents": "write"}, id="git-suffix-dropped-highest-level-wins"),
    pytest.param(run(("read_repo", {"repo": "a"}), ("comment", {"repo": "b"})), ["a", "b"],
                 {"contents": "read", "issues": "write"}, id="union-over-purposes"),
    pytest.param(run(("browse", {})), [], {}, id="unlisted-purpose-adds-nothing"),
])
def test_narrowed(claims: AccessClaims, repos: list[str], perms: dict[str, str]) -> None:
    assert narrowed(CONFIG, claims) == (repos, perms)


KEY = RSAKey.generate_key(2048)
OTHER = RSAKey.generate_key(2048)


def app_jwt(key: RSAKey = KEY, iss: str = "1", iat: int = -60, exp: int = 540) -> str:
    now = int(time.time())
    return jwt.encode({"alg": "RS256", "typ": "JWT"}, {"iss": iss, "iat": now + iat, "exp": now + exp}, key,
                      algorithms=["RS256"])


@pytest.mark.parametrize(("token", "body", "status", "message"), [
    pytest.param(app_jwt(), {"repositories": ["widgets"], "permissions": {"contents": "read"}}, 201, "",
                 id="ok"),
    pytest.param(app_jwt(OTHER), {}, 401, "could not be decoded", id="signed-by-another-key"),
    pytest.param(app_jwt(iss="9"), {}, 401, "Issuer", id="another-app"),
    pytest.param(app_jwt(exp=-1), {}, 401, "Expiration time", id="expired"),
    pytest.param(app_jwt(exp=3600), {}, 401, "too far in the future", id="exp-too-far"),
    pytest.param(app_jwt(iat=600), {}, 401, "Issued at", id="issued-in-the-future"),
    pytest.param(None, {}, 401, "could not be decoded", id="no-jwt"),
    pytest.param(app_jwt(), {"repositories": ["secret-plans"]}, 422, "not accessible", id="repo-outside"),
    pytest.param(app_jwt(), {"permissions": {"administration": "write"}}, 422, "not granted",
                 id="permission-outside"),
    pytest.param(app_jwt(), {"permissions": {"contents": "admin"}}, 422, "not granted", id="level-above"),
])
def test_demo_token_request(token: str | None, body: dict[str, object], status: int, message: str) -> None:
    app = AppInstallation("1", "2", KEY, "acme", {"widgets": 1}, {"contents": "write", "metadata": "read"})
    got, answer = app.create_token(token, "2", body)
    assert got == status, answer
    assert message in answer.get("message", "")
    if status == 201:
        issued = answer["token"]
        assert issued.startswith("ghs_")
        assert app.check(issued, "acme", "widgets", "contents", "read") is None
        assert app.check(issued, "acme", "widgets", "contents", "write").status == 403  # type: ignore[union-attr]
        assert app.check(issued, "acme", "other", "contents", "read").status == 404  # type: ignore[union-attr]
        assert app.revoke(issued)
        assert app.check(issued, "acme", "widgets", "contents", "read").status == 401  # type: ignore[union-attr]


def test_prewarm_claims_of_a_run_record() -> None:
    line = {"event": "run_created", "run": "run_x", "runtime": "rt", "expires": 123, "grants": [
        {"upstream": "gh", "purpose": "read_repo", "params": {"repo": "w"}},
        {"upstream": "other", "purpose": "chat", "params": {}}]}
    claims = claims_of(line, "gh")
    assert claims is not None
    assert (claims.sub, claims.aud, claims.exp, claims.client_id) == ("run_x", "gh", 123, "rt")
    assert [(g.purpose, dict(g.params)) for g in claims.grants] == [("read_repo", {"repo": "w"})]
    assert claims_of(line, "nobody") is None
    assert claims_of({**line, "event": "run_ended"}, "gh") is None
