"""The gateway's steps inside the proxy's terminated tunnels: placeholders checked for their
audience and for the proxy credential's run, passthrough refused, purposes bound, echoes
redacted, a revoked run stopped on the next request of an open tunnel, and a destination given
no credential at all. The client is httpx in-process (proxy and CA from the bundle), for exact
headers; each refusal has its code and leaves the upstream untouched.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import MARKER
from tests.e2e.proxy.conftest import sandbox_for
from tests.e2e.test_curl import fake_github_pat
from tests.support.package_index import PROJECT
from tests.support.proxy_stack import ProxyStack, Sandbox

REPO_API = "https://api.github.com/repos/acme/widgets"
REVOCATION_WAIT = 10.0


def client(box: Sandbox) -> httpx.Client:
    """What an httpx client with ``trust_env`` builds from the bundle, spelled out."""
    context = ssl.create_default_context(cafile=box.env["SSL_CERT_FILE"])
    return httpx.Client(proxy=box.env["HTTPS_PROXY"], verify=context, trust_env=False, timeout=20)


def reason(response: httpx.Response) -> str:
    return str(response.json().get("error", "")) if response.headers.get("content-type", "").startswith(
        "application/json") else ""


Headers = Callable[[dict[str, Any], dict[str, Any]], dict[str, str]]

REFUSED = [
    pytest.param(REPO_API, lambda own, other: {}, 401, "missing_token", id="no-placeholder"),
    pytest.param(REPO_API, lambda own, other: {"Authorization": f"Bearer {other['env']['GITHUB_TOKEN']}"},
                 403, "run_mismatch", id="placeholder-of-another-run"),
    pytest.param(REPO_API, lambda own, other: {"Authorization": f"Bearer {own['env']['OPENAI_API_KEY']}"},
                 401, "audience_mismatch", id="placeholder-of-another-upstream"),
    pytest.param(REPO_API, lambda own, other: {"Authorization": f"token {fake_github_pat()}"},
                 403, "credential_passthrough", id="real-looking-token"),
    pytest.param("https://api.github.com/repos/someone/else",
                 lambda own, other: {"Authorization": f"Bearer {own['env']['GITHUB_TOKEN']}"},
                 403, "purpose_not_granted", id="repository-not-bound"),
]


@pytest.mark.parametrize(("url", "headers", "status", "code"), REFUSED)
def test_refused_inside_upstream_tunnel(stack: ProxyStack, tmp_path: Path, url: str, headers: Headers,
                                        status: int, code: str) -> None:
    own, box = sandbox_for(stack, tmp_path, "github", "openai")
    other = stack.mint("github")
    github = stack.upstreams["github"]
    before = len(github.app.seen)
    with client(box) as http:
        response = http.get(url, headers=headers(own, other))
    assert (response.status_code, reason(response)) == (status, code), response.text[:500]
    assert github.app.seen[before:] == []
    line = stack.request_line(response.headers.get("x-valetkey-request-id"))
    # the run is the proxy credential's: the one that sent the request through its tunnel
    assert (line.get("reason"), line.get("run"), line.get("upstream")) == (code, own["run_id"], "github")


def test_echo_redacted(stack: ProxyStack, tmp_path: Path) -> None:
    bundle, box = sandbox_for(stack, tmp_path, "github")
    secret = stack.secret("github")
    with client(box) as http:
        response = http.get(f"{REPO_API}/debug/headers",
                            headers={"Authorization": f"Bearer {bundle['env']['GITHUB_TOKEN']}"})
    assert response.status_code == 200
    assert MARKER in dict(response.json()["headers"])["authorization"]
    assert secret not in response.text
    assert stack.upstreams["github"].app.seen[-1].header("authorization") == [f"Bearer {secret}"]


@pytest.mark.parametrize(("where", "code"), [
    pytest.param("query", "query:t", id="placeholder-in-query"),
    pytest.param("header", "header:x-trace", id="placeholder-in-kept-header"),
    pytest.param("proxy-token", "query:t", id="proxy-credential-in-query"),
])
def test_run_token_never_reaches_a_destination(stack: ProxyStack, tmp_path: Path, where: str, code: str) -> None:
    """A run token anywhere that would leave for a destination is refused, no dial."""
    bundle, box = sandbox_for(stack, tmp_path, "github", "pypi")
    token = (box.env["HTTPS_PROXY"].removeprefix("http://run:").rsplit("@", 1)[0] if where == "proxy-token"
             else bundle["env"]["GITHUB_TOKEN"])
    index = stack.upstreams["pypi"]
    before = len(index.app.seen)
    with client(box) as http:
        response = http.get(f"https://pypi.org/simple/{PROJECT}/", params={"t": token} if where != "header" else {},
                            headers={"X-Trace": token} if where == "header" else {})
    assert (response.status_code, reason(response)) == (403, "credential_passthrough"), response.text[:500]
    assert index.app.seen[before:] == []
    line = stack.request_line(response.headers.get("x-valetkey-request-id"))
    assert (line.get("passthrough"), line.get("run")) == (code, bundle["run_id"])


def test_destination_gets_no_credential(stack: ProxyStack, tmp_path: Path) -> None:
    """A placeholder sent to a plain destination is stripped, never forwarded (nor a secret)."""
    bundle, box = sandbox_for(stack, tmp_path, "github", "pypi")
    with client(box) as http:
        response = http.get(f"https://pypi.org/simple/{PROJECT}/",
                            headers={"Authorization": f"Bearer {bundle['env']['GITHUB_TOKEN']}"})
    assert response.status_code == 200
    seen = stack.upstreams["pypi"].app.seen[-1]
    assert [k for k, _ in seen.headers if k in ("authorization", "proxy-authorization")] == []


def test_revoked_inside_open_tunnel(stack: ProxyStack, tmp_path: Path) -> None:
    """The proxy credential is checked again on every request, not only at CONNECT."""
    bundle, box = sandbox_for(stack, tmp_path, "pypi")
    index = stack.upstreams["pypi"]
    with client(box) as http:
        assert http.get(f"https://pypi.org/simple/{PROJECT}/").status_code == 200
        stack.revoke(bundle["run_id"])
        deadline = time.monotonic() + REVOCATION_WAIT
        while True:
            seen = len(index.app.seen)
            response = http.get(f"https://pypi.org/simple/{PROJECT}/")
            if response.status_code != 200:
                break
            assert time.monotonic() < deadline, "an open tunnel still serves a revoked run"
            time.sleep(0.1)
    assert reason(response) == "token_revoked", response.text[:500]
    assert len(index.app.seen) == seen  # the refused request never reached the index
