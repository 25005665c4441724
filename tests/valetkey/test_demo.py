"""The demo upstreams on their own: only the real secret opens them, and their policies load.

Through-the-gateway behaviour with real clients is in tests/e2e.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from policies.load import load_policy_dir
from policies.model import Placement
from valetkey.dev.demo.policies import DEMO_RUNTIME, DEMO_UPSTREAMS, demo_grants, write_demo_policies
from valetkey.dev.demo.servers import DemoUpstreams, start_demo_upstreams

SECRETS = {name: f"real-{name}-secret-0123456789abcdef" for name in DEMO_UPSTREAMS}
PLACEHOLDER = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJydW4ifQ.c2ln"  # what a run token looks like


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _auth(name: str, credential: str) -> dict[str, str]:
    if name == "anthropic":
        return {"x-api-key": credential, "anthropic-version": "2023-06-01"}
    if name == "github-git":
        return {"authorization": _basic("x-access-token", credential)}
    return {"authorization": f"Bearer {credential}"}


REQUESTS = {
    "openai": ("GET", "/v1/models", None),
    "anthropic": ("POST", "/v1/messages",
                  {"model": "claude-demo", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    "github": ("GET", "/repos/acme/widgets", None),
    "github-git": ("GET", "/acme/widgets.git/info/refs?service=git-upload-pack", None),
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoUpstreams]:
    with start_demo_upstreams(SECRETS, tmp_path_factory.mktemp("demo")) as upstreams:
        yield upstreams


@pytest.mark.parametrize("name", DEMO_UPSTREAMS)
@pytest.mark.parametrize(("credential", "status"), [
    pytest.param(None, 401, id="none"),
    pytest.param(PLACEHOLDER, 401, id="placeholder"),
    pytest.param("real-secret-but-not-this-one", 401, id="wrong"),
    pytest.param("REAL", 200, id="real"),
])
def test_only_the_real_secret_opens(demo: DemoUpstreams, name: str, credential: str | None, status: int) -> None:
    method, path, body = REQUESTS[name]
    value = SECRETS[name] if credential == "REAL" else credential
    headers = _auth(name, value) if value else {"anthropic-version": "2023-06-01"}
    response = httpx.request(method, demo.urls[name] + path, headers=headers, json=body, timeout=10)
    assert response.status_code == status, response.text
    assert demo.seen[name][-1].path == path.split("?")[0]
    if status == 401 and name == "github-git":
        assert response.headers["www-authenticate"].startswith("Basic realm=")


def test_git_smart_http_advertises_refs(demo: DemoUpstreams) -> None:
    response = httpx.get(demo.urls["github-git"] + "/acme/widgets.git/info/refs?service=git-upload-pack",
                         headers=_auth("github-git", SECRETS["github-git"]), timeout=10)
    assert response.headers["content-type"] == "application/x-git-upload-pack-advertisement"
    assert b"refs/heads/main" in response.content


def test_anthropic_requires_a_version(demo: DemoUpstreams) -> None:
    _, path, body = REQUESTS["anthropic"]
    response = httpx.post(demo.urls["anthropic"] + path, json=body,
                          headers={"x-api-key": SECRETS["anthropic"]}, timeout=10)
    assert (response.status_code, response.json()["error"]["type"]) == (400, "invalid_request_error")


def test_echo_endpoint_echoes_the_credential(demo: DemoUpstreams) -> None:
    response = httpx.get(demo.urls["github"] + "/repos/acme/widgets/debug/headers",
                         headers=_auth("github", SECRETS["github"]), timeout=10)
    assert ["authorization", f"Bearer {SECRETS['github']}"] in response.json()["headers"]


def test_demo_policies_load_and_grant_everything(tmp_path: Path) -> None:
    write_demo_policies(tmp_path, {"openai": 1111, "anthropic": 2222, "github": 3333, "github-git": 4444})
    policies = load_policy_dir(tmp_path)
    assert sorted(policies.upstreams) == sorted(DEMO_UPSTREAMS)
    shipped = load_policy_dir(Path(__file__).resolve().parents[2] / "policies")
    for name, upstream in policies.upstreams.items():
        assert upstream.base_url == f"http://127.0.0.1:{upstream.port}"
        assert upstream.allow_private
        assert upstream.env == shipped.upstreams[name].env  # the sandbox sees the same variables
        assert upstream.injection == shipped.upstreams[name].injection
    assert policies.upstreams["github-git"].injection.placement is Placement.BASIC
    runtime = policies.runtimes[DEMO_RUNTIME]
    assert runtime.identity.vault_policy == "valetkey-runtime-demo-agent"
    for grant in demo_grants():
        purpose = policies.upstreams[grant["upstream"]].purposes[grant["purpose"]]
        assert runtime.may_grant(grant["upstream"], grant["purpose"])
        assert set(grant["params"]) == set(purpose.params)
    assert {(g["upstream"], g["purpose"]) for g in demo_grants()} == {
        (u, p) for u, up in policies.upstreams.items() for p in up.purposes}
    assert policies.alerting.source.endswith("alerts.yaml")


def test_unknown_demo_upstream_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no demo upstream named"):
        write_demo_policies(tmp_path, {"slack": 1})
