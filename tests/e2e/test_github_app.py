"""GitHub App installation tokens end to end: curl and git through gateways whose credential
source is a GitHub App (JWT signed by a Vault transit RSA key), against the demo GitHub, which
checks the App JWT and honours each token only for its repositories and permissions.

The runs are granted an unbound purpose too (any repository's path): the gateway lets it through,
so what refuses the other repository, or the write a read-only run attempts, is the upstream
itself, with the narrowed token.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from joserfc.jwk import RSAKey

from tests.e2e.conftest import assert_never_saw, require_binary, run_client, sandbox_env
from tests.support.servers import ThreadedServer
from tests.support.source_stack import SourceStack, runtime_yaml, source_stack, wait_for
from valetkey.dev.demo.git_http import GitHttp, create_bare_repo
from valetkey.dev.demo.github_app import AppInstallation
from valetkey.dev.demo.github_like import DEMO_OWNER, DEMO_REPO, GitHubLike, Repository, demo_repositories
from valetkey.dev.services import RedisServer, free_port

APP_ID, INSTALLATION = "4242", "77"
OTHER = "secret-plans"
ASKPASS = '#!/bin/sh\nprintf "%s\\n" "$GHGIT_TOKEN"\n'


def _purpose(why: str, methods: list[str], paths: list[str], params: list[str] | None = None) -> dict[str, Any]:
    return {"why": why, "methods": methods, "paths": paths, **({"params": params} if params else {})}


def _source(api_url: str, permissions: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {"kind": "github_app", "app_id": APP_ID, "installation_id": INSTALLATION, "api_url": api_url,
            "private_key": {"transit": {"key": "github-app"}}, "permissions": permissions}


def write_policies(directory: Path, api_port: int, git_port: int, dead_port: int) -> None:
    repo = ["owner", "repo"]
    api = {
        "read_repo": _purpose("Read one repository.", ["GET"], ["/repos/{owner}/{repo}"], repo),
        "read_issues": _purpose("Read issues.", ["GET"], ["/repos/{owner}/{repo}/issues"], repo),
        "browse": _purpose("Any repository's metadata: the token decides.", ["GET"], ["/repos/{owner}/{name}"]),
        "comment_any": _purpose("Comment anywhere: the token decides.", ["POST"],
                                ["/repos/{owner}/{name}/issues/{number}/comments"]),
        "debug_headers": _purpose("The demo echoes request headers back.", ["GET"],
                                  ["/repos/{owner}/{repo}/debug/headers"], repo),
    }
    git = {
        "clone": _purpose("Fetch one repository.", ["GET", "POST"],
                          ["/{owner}/{repo}/info/refs", "/{owner}/{repo}/git-upload-pack"], repo),
        "push": _purpose("Push to one repository.", ["GET", "POST"],
                         ["/{owner}/{repo}/info/refs", "/{owner}/{repo}/git-receive-pack"], repo),
        "clone_any": _purpose("Fetch any repository: the token decides.", ["GET", "POST"],
                              ["/{owner}/{name}/info/refs", "/{owner}/{name}/git-upload-pack"]),
    }
    docs = {
        "ghapp": (api_port, _source(f"http://127.0.0.1:{api_port}", {
            "read_repo": {"metadata": "read"}, "read_issues": {"issues": "read"}}),
            {"header": "Authorization", "format": "Bearer {secret}"}, api),
        "ghgit": (git_port, _source(f"http://127.0.0.1:{api_port}", {
            "clone": {"contents": "read"}, "push": {"contents": "write"}}),
            {"basic": {"username": "x-access-token"}}, git),
        "ghdown": (api_port, _source(f"http://127.0.0.1:{dead_port}", {"read_repo": {"metadata": "read"}}),
                   {"header": "Authorization", "format": "Bearer {secret}"}, api),
    }
    for name, (port, source, inject, purposes) in docs.items():
        env = {"placeholder": f"{name.upper()}_TOKEN", "base_url": f"{name.upper()}_URL"}
        doc = {"version": 1, "kind": "upstream", "name": name, "base_url": f"http://127.0.0.1:{port}",
               "allow_private": True, "source": source, "inject": inject, "env": env, "purposes": purposes}
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (directory / "tester.yaml").write_text(runtime_yaml({"ghapp": list(api), "ghgit": list(git),
                                                         "ghdown": list(api)}))


class Demo:
    def __init__(self, stack: SourceStack, app: AppInstallation, api: GitHubLike, git_root: Path) -> None:
        self.stack, self.app, self.api, self.git_root = stack, app, api, git_root


@pytest.fixture(scope="module")
def demo(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    require_binary("git")
    work = tmp_path_factory.mktemp("github-app")
    key_holder: dict[str, RSAKey] = {}
    repos = demo_repositories()
    repos[f"{DEMO_OWNER}/{OTHER}"] = Repository(DEMO_OWNER, OTHER, 2)
    app = AppInstallation(APP_ID, INSTALLATION, RSAKey.generate_key(2048), DEMO_OWNER,
                          {DEMO_REPO: 1, OTHER: 2}, {"metadata": "read", "contents": "write", "issues": "write"})
    api = GitHubLike("", repositories=repos, app=app)
    root = work / "git"
    for name in (DEMO_REPO, OTHER):
        create_bare_repo(root, DEMO_OWNER, name)
    git = GitHttp("", root, app=app)
    api_server, git_server = ThreadedServer(api).start(), ThreadedServer(git).start()
    write_policies(work, api_server.port, git_server.port, free_port())

    def prepare(vault: Any) -> None:
        """The App's private key is a transit RSA key; GitHub holds its public half."""
        from valetkey.bootstrap import open_client
        with open_client(vault.addr, vault.root_token) as client:
            client.secrets.transit.create_key(name="github-app", key_type="rsa-2048", mount_point="transit")
            pem = client.secrets.transit.read_key(name="github-app", mount_point="transit")["data"]["keys"]["1"]
            key_holder["public"] = RSAKey.import_key(pem["public_key"])
        app.public_key = key_holder["public"]

    try:
        with source_stack(work, redis_server, prepare) as stack:
            yield Demo(stack, app, api, root)
    finally:
        api_server.stop()
        git_server.stop()


def _grants(upstream: str, *purposes: tuple[str, dict[str, str]]) -> list[dict[str, Any]]:
    return [{"upstream": upstream, "purpose": p, "params": params} for p, params in purposes]


BOUND = {"owner": DEMO_OWNER, "repo": DEMO_REPO}


def _curl(url: str, token: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    curl = require_binary("curl")
    ran = run_client([curl, "-sS", "-o", "-", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {token}",
                      *extra, url], {"PATH": "/usr/bin:/bin"})
    body, _, status = ran.stdout.rpartition("\n")
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}
    return int(status), parsed, ran.output


def test_curl_token_narrowed_at_the_upstream(demo: Demo) -> None:
    stack = demo.stack
    issued = demo.app.issued
    bundle = stack.mint(_grants("ghapp", ("read_repo", BOUND), ("read_issues", BOUND), ("browse", {}),
                                ("comment_any", {}), ("debug_headers", BOUND)))
    token, base = bundle["env"]["GHAPP_TOKEN"], stack.url("ghapp")
    # issued when the broker created the run, before its first request (off the request path)
    wait_for(lambda: demo.app.issued == issued + 1)
    gateway = stack.app("ghapp").gateway
    assert gateway is not None
    assert gateway.credentials is not None
    wait_for(lambda: gateway.credentials.held(bundle["run_id"]) is not None)

    status, body, out = _curl(f"{base}/repos/{DEMO_OWNER}/{DEMO_REPO}", token)
    assert (status, body.get("full_name")) == (200, f"{DEMO_OWNER}/{DEMO_REPO}"), out
    status, body, out = _curl(f"{base}/repos/{DEMO_OWNER}/{DEMO_REPO}/issues", token)
    assert (status, len(body)) == (200, 2), out
    assert demo.app.issued == issued + 1  # one token for the run, cached
    live = [t for t in demo.app.tokens.values() if t.expires_at > 0]
    mine = max(live, key=lambda t: t.expires_at)
    assert mine.repositories == {DEMO_REPO}
    assert dict(mine.permissions) == {"metadata": "read", "issues": "read"}

    # the gateway lets these through (unbound purposes); GitHub refuses them with the narrowed token
    status, body, out = _curl(f"{base}/repos/{DEMO_OWNER}/{OTHER}", token)
    assert (status, body.get("message")) == (404, "Not Found"), out
    status, body, out = _curl(f"{base}/repos/{DEMO_OWNER}/{DEMO_REPO}/issues/1/comments", token,
                              "-X", "POST", "-H", "content-type: application/json", "-d", '{"body": "hi"}')
    assert (status, body.get("message")) == (403, "Resource not accessible by integration"), out
    assert_never_saw(mine.token, out)
    wait_for(lambda: len(stack.audit(bundle["run_id"])) >= 4)

    # the upstream echoes the injected token back: redacted with the run's own forms
    status, body, out = _curl(f"{base}/repos/{DEMO_OWNER}/{DEMO_REPO}/debug/headers", token)
    assert status == 200, out
    echoed = [value for name, value in body["headers"] if name == "authorization"]
    assert len(echoed) == 1, out
    assert "[REDACTED:valetkey]" in echoed[0], out
    assert_never_saw(mine.token, out)
    lines = stack.audit(bundle["run_id"])
    assert {line["credential_kind"] for line in lines} == {"github_installation_token"}
    assert all(line["credential_id"].startswith("expires ") for line in lines)
    assert not any(mine.token in json.dumps(line) for line in lines)

    # run end: the gateway revokes the token at GitHub
    revoked = demo.app.revoked
    stack.end(bundle["run_id"])
    wait_for(lambda: demo.app.revoked == revoked + 1)
    assert mine.token not in demo.app.tokens


def test_each_replica_holds_its_own_token_and_run_end_revokes_all(demo: Demo) -> None:
    """Two replicas of one upstream: each issues the run's installation token at run creation (a
    token could be shared only through Redis, which holds no secret); a token one replica issued,
    sent back through the other, is passthrough; run end revokes both at GitHub."""
    stack = demo.stack
    replica = stack.start_gateway("ghapp")
    try:
        issued, revoked = demo.app.issued, demo.app.revoked
        bundle = stack.mint(_grants("ghapp", ("read_repo", BOUND)))
        wait_for(lambda: demo.app.issued == issued + 2)  # one per replica, at run creation
        tokens = [t.token for t in demo.app.tokens.values() if t.expires_at > 0][-2:]
        credentials = stack.app("ghapp").gateway.credentials  # type: ignore[union-attr]
        assert credentials is not None
        wait_for(lambda: credentials.held(bundle["run_id"]) is not None)
        held = credentials.held(bundle["run_id"])
        assert held is not None
        token = bundle["env"]["GHAPP_TOKEN"]
        status, body, out = _curl(f"{replica.url}/repos/{DEMO_OWNER}/{DEMO_REPO}", token)
        assert status == 200, out
        status, body, out = _curl(f"{replica.url}/repos/{DEMO_OWNER}/{DEMO_REPO}", token,
                                  "-H", f"X-Note: {held.credential.value.reveal()}")
        assert (status, body.get("error")) == (403, "credential_passthrough"), out
        stack.end(bundle["run_id"])
        wait_for(lambda: demo.app.revoked == revoked + 2)
        assert not set(tokens) & set(demo.app.tokens)
    finally:
        replica.stop()


def test_source_down_is_503_and_other_upstreams_work(demo: Demo) -> None:
    stack = demo.stack
    bundle = stack.mint([*_grants("ghdown", ("read_repo", BOUND)), *_grants("ghapp", ("read_repo", BOUND))])
    status, body, out = _curl(f"{stack.url('ghdown')}/repos/{DEMO_OWNER}/{DEMO_REPO}",
                              bundle["env"]["GHDOWN_TOKEN"])
    assert (status, body.get("error")) == (503, "credential_source_unavailable"), out
    status, body, out = _curl(f"{stack.url('ghapp')}/repos/{DEMO_OWNER}/{DEMO_REPO}",
                              bundle["env"]["GHAPP_TOKEN"])
    assert status == 200, out
    metrics = stack.app("ghdown").gateway.metrics.registry if stack.app("ghdown").gateway else None
    assert metrics is not None
    failures = metrics.get_sample_value("valetkey_gateway_credential_issued_total", {
        "upstream": "ghdown", "kind": "github_installation_token", "result": "credential_source_unavailable"})
    assert failures in (1.0, 2.0)  # the request's, and the one tried ahead when the run was created


def test_git_clone_and_push_with_an_installation_token(demo: Demo, tmp_path: Path) -> None:
    git = require_binary("git")
    stack = demo.stack
    bundle = stack.mint(_grants("ghgit", ("clone", {"owner": DEMO_OWNER, "repo": f"{DEMO_REPO}.git"}),
                                ("push", {"owner": DEMO_OWNER, "repo": f"{DEMO_REPO}.git"}), ("clone_any", {})))
    askpass = tmp_path / "askpass.sh"
    askpass.write_text(ASKPASS)
    askpass.chmod(0o755)
    env = sandbox_env(bundle, tmp_path / "home", GIT_ASKPASS=str(askpass), GIT_TERMINAL_PROMPT="0",
                      GIT_CONFIG_NOSYSTEM="1")
    host = stack.url("ghgit").removeprefix("http://")
    work = tmp_path / "widgets"
    ran = [run_client([git, "clone", f"http://x-access-token@{host}/{DEMO_OWNER}/{DEMO_REPO}.git", str(work)], env)]
    assert ran[-1].returncode == 0, ran[-1].stderr[-2000:]
    for argv in (["config", "user.name", "Agent"], ["config", "user.email", "agent@valetkey.invalid"]):
        run_client([git, "-C", str(work), *argv], env)
    (work / "NOTES.md").write_text("pushed with an installation token\n")
    for argv in (["add", "NOTES.md"], ["commit", "--quiet", "-m", "notes"], ["push", "origin", "main"]):
        ran.append(run_client([git, "-C", str(work), *argv], env))
        assert ran[-1].returncode == 0, ran[-1].stderr[-2000:]
    bare = demo.git_root / DEMO_OWNER / f"{DEMO_REPO}.git"
    head = run_client([git, "-C", str(work), "rev-parse", "HEAD"], env).stdout.strip()
    assert run_client([git, "--git-dir", str(bare), "rev-parse", "main"], env).stdout.strip() == head

    # the other repository: the gateway forwards (clone_any), the upstream refuses the token
    ran.append(run_client([git, "clone", f"http://x-access-token@{host}/{DEMO_OWNER}/{OTHER}.git",
                           str(tmp_path / "other")], env))
    assert ran[-1].returncode != 0
    assert "Repository not found" in ran[-1].stderr or "not found" in ran[-1].stderr.lower(), ran[-1].stderr
    for token in list(demo.app.tokens):
        assert_never_saw(token, *(r.output for r in ran))
