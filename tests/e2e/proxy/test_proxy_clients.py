"""Unmodified clients through the egress proxy, holding only the run bundle's env: curl, git clone
and push, pip install, httpx. Nothing is pointed at valetkey: each client uses the real-looking
host it would use anyway, the proxy from ``HTTPS_PROXY`` and the CA from its own variable.

Each test shows: the upstream saw the real secret (credentialed upstreams), the client never did
(not in its output, its files or its env), and the audit lines name the run.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Ran, assert_never_saw, files_with, require_binary, run_client
from tests.e2e.proxy.conftest import every_secret, sandbox_for
from tests.support.package_index import GREETING, MODULE, PROJECT, WHEEL_PATH
from tests.support.proxy_policies import MIRROR_HOST
from tests.support.proxy_stack import ProxyStack
from valetkey.dev.demo.git_http import GIT_USERNAME
from valetkey.dev.demo.github_like import DEMO_OWNER, DEMO_REPO

CLIENTS = Path(__file__).parent / "clients"
ASKPASS = '#!/bin/sh\nprintf "%s\\n" "$GIT_PASSWORD"\n'
REPO_API = f"https://api.github.com/repos/{DEMO_OWNER}/{DEMO_REPO}"


def never_leaked(stack: ProxyStack, env: dict[str, str], *ran: Ran, roots: tuple[Path, ...] = ()) -> None:
    """No secret the stack holds is in what the client printed, its env, or files it wrote."""
    for secret in every_secret(stack):
        assert_never_saw(secret, json.dumps(env), *(r.output for r in ran))
        for root in roots:
            assert files_with(root, secret) == []


def curl(env: dict[str, str], workdir: Path, args: str) -> tuple[Ran, int, str]:
    """``curl -v <args>`` in a shell: (the run, the status, the body)."""
    require_binary("curl")
    workdir.mkdir(parents=True, exist_ok=True)
    ran = run_client(["sh", "-c", f"curl -sS -v -D headers -o body {args}"], env, cwd=workdir)
    assert ran.returncode == 0, ran.stderr[-3000:]
    # the last header block: the first is the proxy's answer to CONNECT
    last = (workdir / "headers").read_bytes().decode("latin-1").strip().split("\r\n\r\n")[-1]
    status = int(last.split(None, 2)[1])
    return ran, status, (workdir / "body").read_bytes().decode("latin-1")


def issuer(ran: Ran) -> str:
    """The issuer of the server certificate curl verified (from ``curl -v``)."""
    found = re.search(r"^\*\s+issuer: (.*)$", ran.stderr, re.MULTILINE)
    assert found, ran.stderr[-2000:]
    return found.group(1)


def test_curl_terminated_destination_and_placeholder(stack: ProxyStack, tmp_path: Path) -> None:
    bundle, box = sandbox_for(stack, tmp_path, "github", "pypi", "pythonhosted")
    run_id, before = bundle["run_id"], len(stack.upstreams["github"].app.seen)

    index = curl(box.env, tmp_path / "index", f"https://pypi.org/simple/{PROJECT}/")
    repo = curl(box.env, tmp_path / "repo", f'-H "Authorization: Bearer $GITHUB_TOKEN" "{REPO_API}"')
    wheel = curl(box.env, tmp_path / "wheel", f"https://files.pythonhosted.org{WHEEL_PATH}")

    assert index[1] == 200
    assert WHEEL_PATH in index[2]
    # terminate: the proxy's leaf from the deployment CA; tunnel: the upstream's own certificate
    assert "valetkey test CA" not in issuer(index[0])
    assert "valetkey test CA" not in issuer(repo[0])
    assert "valetkey test CA" in issuer(wheel[0])
    assert wheel[1] == 200
    assert stack.upstreams["pypi"].app.seen[-1].path == f"/simple/{PROJECT}/"
    assert (repo[1], json.loads(repo[2])["full_name"]) == (200, f"{DEMO_OWNER}/{DEMO_REPO}")
    secret = stack.secret("github")
    [seen] = stack.upstreams["github"].app.seen[before:]
    assert seen.header("authorization") == [f"Bearer {secret}"]
    assert bundle["env"]["GITHUB_TOKEN"] not in repr(seen)
    assert stack.upstreams["github"].sni[-1] == "api.github.com"  # upstream TLS with the real name
    never_leaked(stack, box.env, index[0], repo[0], wheel[0])
    assert secret not in index[2] + repo[2]

    for name in ("pypi", "pythonhosted"):
        lines = stack.named_audit(run_id, name)
        assert any(x.get("decision") == "allow" for x in lines), lines
    lines = stack.named_audit(run_id, "github")
    assert any(x.get("decision") == "allow" and x.get("status") == 200 for x in lines), lines


def test_curl_outside_host_refused(stack: ProxyStack, tmp_path: Path) -> None:
    """What an unmodified client sees of a host outside the allowlist: its CONNECT refused."""
    bundle, box = sandbox_for(stack, tmp_path, "pypi")
    before = stack.connections()
    ran = run_client(["curl", "-sS", "-v", "https://pypi.example.com/simple/"], box.env, cwd=tmp_path)
    assert ran.returncode != 0
    assert re.search(r"CONNECT tunnel failed, response 403|Received HTTP code 403 from proxy", ran.stderr), ran.stderr
    assert stack.connections() == before
    lines = stack.audit(lambda x: x.get("run") == bundle["run_id"] and x.get("method") == "CONNECT")
    assert [(x.get("path"), x.get("decision"), x.get("reason")) for x in lines] == [
        ("pypi.example.com:443", "deny", "destination_not_allowed")]


def test_curl_plain_http(stack: ProxyStack, tmp_path: Path) -> None:
    """Absolute-form ``http://`` through ``HTTP_PROXY``: the same rules, the credential on the request."""
    bundle, box = sandbox_for(stack, tmp_path, "mirror")
    mirror = stack.upstreams["mirror"]
    before = len(mirror.app.seen)

    index = curl(box.env, tmp_path / "index", f"http://{MIRROR_HOST}/simple/{PROJECT}/")
    refused = curl(box.env, tmp_path / "refused", f"http://{MIRROR_HOST}/simple/")

    assert index[1] == 200
    assert WHEEL_PATH in index[2]
    assert (refused[1], json.loads(refused[2])["error"]) == (403, "purpose_not_granted")
    assert [h.path for h in mirror.app.seen[before:]] == [f"/simple/{PROJECT}/"]
    assert not any(k == "proxy-authorization" for h in mirror.app.seen[before:] for k, _ in h.headers)
    lines = stack.named_audit(bundle["run_id"], "mirror", 2)
    assert sorted((x.get("decision"), x.get("reason")) for x in lines) == [
        ("allow", "ok"), ("deny", "purpose_not_granted")], lines


@pytest.mark.slow
def test_git_clone_and_push(stack: ProxyStack, tmp_path: Path) -> None:
    git = require_binary("git")
    askpass = tmp_path / "askpass.sh"
    askpass.write_text(ASKPASS)
    askpass.chmod(0o755)
    bundle, box = sandbox_for(stack, tmp_path, "github-git", GIT_ASKPASS=str(askpass),
                              GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1")
    work, before = tmp_path / "widgets", len(stack.upstreams["github-git"].app.seen)
    url = f"https://{GIT_USERNAME}@github.com/{DEMO_OWNER}/{DEMO_REPO}.git"

    ran = [run_client([git, "clone", url, str(work)], box.env)]
    assert ran[-1].returncode == 0, ran[-1].stderr[-3000:] + "\n--- proxy log:\n" + stack.log_tail()
    assert (work / "README.md").read_text().startswith("# widgets")
    (work / "CHANGELOG.md").write_text("- pushed through the valetkey proxy\n")
    for argv in (["config", "user.name", "Proxy Agent"], ["config", "user.email", "agent@valetkey.invalid"],
                 ["add", "CHANGELOG.md"], ["commit", "--quiet", "-m", "Add a changelog"],
                 ["push", "origin", "main"]):
        ran.append(run_client([git, "-C", str(work), *argv], box.env))
        assert ran[-1].returncode == 0, ran[-1].stderr[-3000:]
    head = run_client([git, "-C", str(work), "rev-parse", "HEAD"], box.env).stdout.strip()
    bare = stack.git_root / DEMO_OWNER / f"{DEMO_REPO}.git"
    assert run_client([git, "--git-dir", str(bare), "rev-parse", "main"], box.env).stdout.strip() == head

    secret = stack.secret("github-git")
    seen = stack.upstreams["github-git"].app.seen[before:]
    basic = "Basic " + base64.b64encode(f"{GIT_USERNAME}:{secret}".encode()).decode()
    assert {s.path.rsplit("/", 1)[-1] for s in seen} >= {"refs", "git-upload-pack", "git-receive-pack"}
    assert all(s.header("authorization") == [basic] for s in seen)
    never_leaked(stack, box.env, *ran, roots=(box.home, work))

    lines = stack.named_audit(bundle["run_id"], "github-git", 3)
    allowed = {(x.get("method"), x.get("purpose")) for x in lines if x.get("decision") == "allow"}
    assert {("POST", "clone"), ("POST", "push")} <= allowed, lines


@pytest.mark.slow
def test_pip_install_from_https_index(stack: ProxyStack, tmp_path: Path) -> None:
    # minted as a sandbox runtime would: `valetkey run create --files-dir` writes the CA file
    bundle, box = stack.mint_cli(tmp_path / "sandbox", "pypi", "pythonhosted")
    target = tmp_path / "target"
    files_before = stack.upstreams["pythonhosted"].connections

    # pip's own defaults: index https://pypi.org/simple, proxy and --cert from the environment
    ran = run_client([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
                      "--no-input", "--target", str(target), PROJECT], box.env)

    assert ran.returncode == 0, ran.output[-3000:] + "\n--- proxy log:\n" + stack.log_tail()
    check = run_client([sys.executable, "-c", f"import {MODULE}; print({MODULE}.GREETING)"],
                       {**box.env, "PYTHONPATH": str(target)})
    assert check.stdout.strip() == GREETING
    assert f"/simple/{PROJECT}/" in [h.path for h in stack.upstreams["pypi"].app.seen]
    assert WHEEL_PATH in [h.path for h in stack.upstreams["pythonhosted"].app.seen]
    assert stack.upstreams["pythonhosted"].connections > files_before  # through the tunnel
    never_leaked(stack, box.env, ran)

    for name in ("pypi", "pythonhosted"):
        lines = stack.named_audit(bundle["run_id"], name)
        assert any(x.get("decision") == "allow" for x in lines), lines


def test_httpx_trust_env(stack: ProxyStack, tmp_path: Path) -> None:
    bundle, box = sandbox_for(stack, tmp_path, "github", "pypi")
    before = len(stack.upstreams["github"].app.seen)

    ran = run_client([sys.executable, str(CLIENTS / "httpx_get.py")], box.env)

    assert ran.returncode == 0, ran.stderr[-3000:] + "\n--- proxy log:\n" + stack.log_tail()
    result = json.loads(ran.stdout)
    assert result["issues"]["status"] == 200
    assert [i["number"] for i in json.loads(result["issues"]["body"])] == [1, 2]
    assert result["index"]["status"] == 200
    assert WHEEL_PATH in result["index"]["body"]
    secret = stack.secret("github")
    [seen] = stack.upstreams["github"].app.seen[before:]
    assert seen.header("authorization") == [f"Bearer {secret}"]
    never_leaked(stack, box.env, ran)

    request_ids = {v for k, v in result["issues"]["headers"].items() if k == "x-valetkey-request-id"}
    lines = stack.named_audit(bundle["run_id"], "github")
    assert any(x.get("purpose") == "read_issues" and x.get("decision") == "allow" for x in lines), lines
    if request_ids:  # the gateway pipeline's request id, when the proxy passes it on
        assert any(x.get("request_id") in request_ids for x in lines)
