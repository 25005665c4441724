"""``git clone`` and ``git push`` over smart-HTTP through the github-git gateway.

git is given only the run bundle's env: the clone URL carries the username, and the password
comes from ``GIT_ASKPASS`` printing ``$GIT_PASSWORD`` (the placeholder) — which git asks for only
after the gateway's ``401`` Basic challenge. ``GIT_TRACE_CURL`` records every header and byte git
received, so the test can show both the challenge and that the real secret never arrived.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.e2e.conftest import (
    Ran,
    Stack,
    assert_never_saw,
    files_with,
    require_binary,
    run_client,
    sandbox_env,
)
from valetkey.dev.demo.git_http import GIT_USERNAME
from valetkey.dev.demo.github_like import DEMO_OWNER, DEMO_REPO

ASKPASS = '#!/bin/sh\nprintf "%s\\n" "$GIT_PASSWORD"\n'
REQUEST_ID = re.compile(r"Recv header: x-valetkey-request-id: ([0-9a-f]+)", re.IGNORECASE)


def _clone_url(base_url: str) -> str:
    """``$GIT_BASE_URL/acme/widgets.git`` with the username (never a password) in it."""
    parts = urlsplit(base_url)
    path = f"{parts.path.rstrip('/')}/{DEMO_OWNER}/{DEMO_REPO}.git"
    return urlunsplit((parts.scheme, f"{GIT_USERNAME}@{parts.netloc}", path, "", ""))


def test_clone_and_push(e2e_stack: Stack, tmp_path: Path) -> None:
    git = require_binary("git")
    bundle = e2e_stack.mint(("github-git",))
    askpass = tmp_path / "askpass.sh"
    askpass.write_text(ASKPASS)
    askpass.chmod(0o755)
    home, work = tmp_path / "home", tmp_path / "widgets"
    env = sandbox_env(bundle, home, GIT_ASKPASS=str(askpass), GIT_TERMINAL_PROMPT="0",
                      GIT_CONFIG_NOSYSTEM="1", GIT_TRACE_CURL="1")
    before = len(e2e_stack.demo.seen["github-git"])

    ran: list[Ran] = [run_client([git, "clone", _clone_url(bundle["env"]["GIT_BASE_URL"]), str(work)], env)]
    assert ran[-1].returncode == 0, ran[-1].stderr[-3000:]
    assert (work / "README.md").read_text().startswith("# widgets")
    for argv in (["config", "user.name", "Demo Agent"], ["config", "user.email", "agent@valetkey.invalid"]):
        ran.append(run_client([git, "-C", str(work), *argv], env))
        assert ran[-1].returncode == 0, ran[-1].stderr
    (work / "CHANGELOG.md").write_text("- pushed through the valetkey gateway\n")
    for argv in (["add", "CHANGELOG.md"], ["commit", "--quiet", "-m", "Add a changelog"],
                 ["push", "origin", "main"]):
        ran.append(run_client([git, "-C", str(work), *argv], env))
        assert ran[-1].returncode == 0, ran[-1].stderr[-3000:]
    head = run_client([git, "-C", str(work), "rev-parse", "HEAD"], env).stdout.strip()
    bare = e2e_stack.demo.git_root / DEMO_OWNER / f"{DEMO_REPO}.git"
    assert run_client([git, "--git-dir", str(bare), "rev-parse", "main"], env).stdout.strip() == head

    # git met the gateway's Basic challenge, then answered it with the placeholder
    traces = "".join(r.stderr for r in ran)
    assert re.search(r"Recv header: HTTP/1\.1 401", traces), "git was never challenged"
    assert re.search(r"Recv header: www-authenticate: Basic realm=", traces, re.IGNORECASE)

    # the upstream saw only the real secret (username x-access-token), and only after the gateway
    secret = e2e_stack.secret("github-git")
    seen = e2e_stack.demo.seen["github-git"][before:]
    basic = "Basic " + base64.b64encode(f"{GIT_USERNAME}:{secret}".encode()).decode()
    assert {s.path for s in seen} == {f"/{DEMO_OWNER}/{DEMO_REPO}.git/{p}"
                                      for p in ("info/refs", "git-upload-pack", "git-receive-pack")}
    assert all(s.header("authorization") == [basic] for s in seen)
    assert not any(bundle["env"]["GIT_PASSWORD"] in repr(s) for s in seen)
    # git never saw it: not in anything it printed or traced, nor in any file it wrote
    assert_never_saw(secret, *(r.output for r in ran))
    assert files_with(home, secret) == []
    assert files_with(work, secret) == []

    # one audit line per request git made, found by the request id each response carried
    lines = [e2e_stack.audit_request(rid) for rid in REQUEST_ID.findall(traces)]
    challenges = [x for x in lines if x["status"] == 401]
    allowed = [x for x in lines if x["status"] != 401]
    assert challenges, "no audit line for the challenges"
    # a challenge carries no run: git had sent no credential yet
    assert {(x["decision"], x["reason"], x["run"]) for x in challenges} == {("deny", "missing_token", "")}
    assert {(x["decision"], x["status"], x["run"], x["upstream"]) for x in allowed} == {
        ("allow", 200, bundle["run_id"], "github-git")}
    repo = f"/{DEMO_OWNER}/{DEMO_REPO}.git"
    assert {("GET", f"{repo}/info/refs?service=***", "clone"), ("POST", f"{repo}/git-upload-pack", "clone"),
            ("POST", f"{repo}/git-receive-pack", "push")} <= {(x["method"], x["path"], x["purpose"]) for x in allowed}
    # and the run's lines in the stream are exactly those
    assert sorted(x["request_id"] for x in e2e_stack.audit(bundle["run_id"], len(allowed))) == sorted(
        x["request_id"] for x in allowed)
