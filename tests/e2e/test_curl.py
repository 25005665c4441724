"""``curl`` against the github gateway, as an agent types it: ``$GITHUB_TOKEN`` and
``$GITHUB_API_URL`` expanded by the shell from the run bundle's env.

A normal read and comment go through with the real secret injected; a real-looking ``ghp_``
token is refused before anything reaches the upstream (and the run is revoked, as the demo alerts
policy says); an upstream that echoes the request headers back has the secret redacted.
"""

from __future__ import annotations

import json
import secrets
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.conftest import MARKER, Ran, Stack, assert_never_saw, require_binary, run_client, sandbox_env
from valetkey.dev.demo.github_like import DEMO_OWNER, DEMO_REPO

REPO = f"$GITHUB_API_URL/repos/{DEMO_OWNER}/{DEMO_REPO}"
AUTH = '-H "Authorization: Bearer $GITHUB_TOKEN"'


@dataclass
class Reply:
    ran: Ran
    status: int
    headers: str
    body: str

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def request_id(self) -> str:
        return next(line.split(":", 1)[1].strip() for line in self.headers.splitlines()
                    if line.lower().startswith("x-valetkey-request-id:"))

    @property
    def everything(self) -> str:
        return self.ran.output + self.headers + self.body


def curl(env: dict[str, str], workdir: Path, args: str) -> Reply:
    """``curl -v <args>`` in a shell; headers and body land in files the test then reads."""
    require_binary("curl")
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("headers", "body"):
        (workdir / name).unlink(missing_ok=True)
    ran = run_client(["sh", "-c", f"curl -sS -v -D headers -o body {args}"], env, cwd=workdir)
    assert ran.returncode == 0, ran.stderr
    headers = (workdir / "headers").read_text()
    status = int(headers.split(None, 2)[1])
    return Reply(ran, status, headers, (workdir / "body").read_text())


def fake_github_pat() -> str:
    """Real-looking (the provider's pattern), never a real token."""
    return "ghp_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(36))


def test_read_and_comment(e2e_stack: Stack, tmp_path: Path) -> None:
    bundle = e2e_stack.mint(("github",))
    env = sandbox_env(bundle, tmp_path / "home")
    before = len(e2e_stack.demo.seen["github"])

    repo = curl(env, tmp_path, f'{AUTH} "{REPO}"')
    issues = curl(env, tmp_path, f'{AUTH} "{REPO}/issues"')
    comment = curl(env, tmp_path, f'{AUTH} -H "Content-Type: application/json" '
                                  f'-d \'{{"body": "Looked into it from the sandbox."}}\' "{REPO}/issues/1/comments"')

    assert (repo.status, repo.json()["full_name"]) == (200, f"{DEMO_OWNER}/{DEMO_REPO}")
    assert issues.status == 200
    assert [i["number"] for i in issues.json()] == [1, 2]
    assert comment.status == 201
    assert comment.json()["body"] == "Looked into it from the sandbox."

    secret = e2e_stack.secret("github")
    seen = e2e_stack.demo.seen["github"][before:]
    assert [(s.method, s.path) for s in seen] == [
        ("GET", f"/repos/{DEMO_OWNER}/{DEMO_REPO}"), ("GET", f"/repos/{DEMO_OWNER}/{DEMO_REPO}/issues"),
        ("POST", f"/repos/{DEMO_OWNER}/{DEMO_REPO}/issues/1/comments")]
    assert all(s.header("authorization") == [f"Bearer {secret}"] for s in seen)
    assert not any(bundle["env"]["GITHUB_TOKEN"] in repr(s) for s in seen)
    assert_never_saw(secret, repo.everything, issues.everything, comment.everything)

    lines = e2e_stack.audit(bundle["run_id"], 3)
    assert sorted((x["method"], x["purpose"], x["decision"], x["status"]) for x in lines) == [
        ("GET", "read_issues", "allow", 200), ("GET", "read_repo", "allow", 200),
        ("POST", "comment_issue", "allow", 201)]


def test_real_token_refused(e2e_stack: Stack, tmp_path: Path) -> None:
    bundle = e2e_stack.mint(("github",))
    env = sandbox_env(bundle, tmp_path / "home")
    pat = fake_github_pat()
    before = len(e2e_stack.demo.seen["github"])

    # an agent that found a real token and uses it instead of the placeholder
    instead = curl(env, tmp_path, f'-H "Authorization: token {pat}" "{REPO}"')
    # an agent that smuggles one in a comment body next to its placeholder
    smuggled = curl(env, tmp_path, f'{AUTH} -H "Content-Type: application/json" '
                                   f'-d \'{{"body": "try {pat}"}}\' "{REPO}/issues/1/comments"')

    for reply in (instead, smuggled):
        assert reply.status == 403
        assert reply.json()["error"] == "credential_passthrough"
        assert pat not in reply.body + reply.headers
    assert e2e_stack.demo.seen["github"][before:] == []  # nothing reached the upstream

    refused = [e2e_stack.audit_request(instead.request_id), e2e_stack.audit_request(smuggled.request_id)]
    assert [(x["decision"], x["reason"], x["status"]) for x in refused] == [
        ("deny", "credential_passthrough", 403)] * 2
    assert [x["run"] for x in refused] == ["", bundle["run_id"]]  # only the second carried the run
    assert [x["passthrough"] != "" for x in refused] == [True, True]
    assert not any(pat in json.dumps(x) for x in refused)  # refused, never logged
    assert_never_saw(e2e_stack.secret("github"), instead.everything, smuggled.everything)

    # the demo alerts policy revokes a run that tried a passthrough
    deadline = time.monotonic() + 10
    while (after := curl(env, tmp_path, f'{AUTH} "{REPO}"')).status != 401 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (after.status, after.json()["error"]) == (401, "token_revoked"), after.body
    assert e2e_stack.audit_request(after.request_id)["reason"] == "token_revoked"


def test_echo_redacted(e2e_stack: Stack, tmp_path: Path) -> None:
    bundle = e2e_stack.mint(("github",))
    env = sandbox_env(bundle, tmp_path / "home")
    before = len(e2e_stack.demo.seen["github"])

    echo = curl(env, tmp_path, f'{AUTH} "{REPO}/debug/headers"')

    assert echo.status == 200
    echoed = dict(echo.json()["headers"])
    assert MARKER in echoed["authorization"]
    secret = e2e_stack.secret("github")
    [seen] = e2e_stack.demo.seen["github"][before:]
    assert seen.header("authorization") == [f"Bearer {secret}"]  # the upstream did send it back
    assert_never_saw(secret, echo.everything)

    [line] = e2e_stack.audit(bundle["run_id"], 1)
    assert (line["path"], line["purpose"], line["decision"], line["status"]) == (
        f"/repos/{DEMO_OWNER}/{DEMO_REPO}/debug/headers", "debug_headers", "allow", 200)
    assert line["redactions"] >= 1
