"""A git smart-HTTP demo server: ``git http-backend`` run as CGI behind HTTP Basic authentication.

Only ``x-access-token:<real secret>`` is accepted (GitHub's convention for token auth over git);
anything else gets ``401`` with ``WWW-Authenticate: Basic``, the challenge git answers by asking
its credential helper or ``GIT_ASKPASS`` for the password. Repositories live under
``project_root/<owner>/<name>.git``; a client clones ``http://host/<owner>/<name>.git``, so git
requests ``/<owner>/<name>.git/info/refs?service=...`` and ``POST /<owner>/<name>.git/git-upload-pack``
(or ``git-receive-pack`` to push). Pushing is enabled per repository by ``http.receivepack``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from contract.errors import ServiceError
from valetkey.dev.demo.common import DemoUpstream, basic_credentials, same_secret
from valetkey.dev.demo.github_app import AppInstallation

log = logging.getLogger("valetkey.demo.git")
GIT_USERNAME = "x-access-token"
REALM = "valetkey demo git"
DEFAULT_FILES = {"README.md": "# widgets\n\nA valetkey demo repository.\n"}
CGI_HEAD_LIMIT = 64 * 1024
# request headers that CGI passes as their own variables, or never (the credential)
NOT_PASSED = frozenset({"authorization", "content-type", "content-length", "proxy-authorization"})


def find_git() -> str:
    found = shutil.which("git")
    if found is None:
        raise ServiceError("`git` not found on PATH; install it (Debian: apt-get install -y git)")
    return found


def _git_env(home: Path) -> dict[str, str]:
    """A git environment that reads no user or system configuration."""
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
            "LANG": "C"}


def create_bare_repo(root: Path, owner: str, name: str, files: Mapping[str, str] | None = None,
                     branch: str = "main") -> Path:
    """``root/<owner>/<name>.git``: a bare repository with one commit of ``files`` (flat names) on
    ``branch``, pushable over HTTP. Returns its path."""
    git = find_git()
    path = root / owner / f"{name}.git"
    env = {**_git_env(root), "GIT_AUTHOR_NAME": "valetkey demo", "GIT_AUTHOR_EMAIL": "demo@valetkey.invalid",
           "GIT_COMMITTER_NAME": "valetkey demo", "GIT_COMMITTER_EMAIL": "demo@valetkey.invalid"}

    def run(*args: str, stdin: str = "") -> str:
        try:
            done = subprocess.run(  # noqa: S603 - fixed argv, git found on PATH
                [git, *args], input=stdin, env=env, capture_output=True, text=True, check=True, timeout=30
            )
        except subprocess.CalledProcessError as exc:
            raise ServiceError(f"git {args[0]} failed creating {path}: {exc.stderr.strip()}") from exc
        return done.stdout.strip()

    path.parent.mkdir(parents=True, exist_ok=True)
    run("init", "--quiet", "--bare", f"--initial-branch={branch}", str(path))
    run("--git-dir", str(path), "config", "http.receivepack", "true")
    entries = []
    for filename, content in sorted((files or DEFAULT_FILES).items()):
        blob = run("--git-dir", str(path), "hash-object", "-w", "--stdin", stdin=content)
        entries.append(f"100644 blob {blob}\t{filename}\n")
    tree = run("--git-dir", str(path), "mktree", stdin="".join(entries))
    commit = run("--git-dir", str(path), "commit-tree", tree, "-m", "Initial commit")
    run("--git-dir", str(path), "update-ref", f"refs/heads/{branch}", commit)
    return path


@dataclass
class GitHttp(DemoUpstream):
    """``project_root`` holds the repositories; ``git`` is the executable (found on PATH)."""

    project_root: Path
    username: str = GIT_USERNAME
    app: AppInstallation | None = None  # a GitHub App installed here: its tokens are honoured too

    def __post_init__(self) -> None:
        super().__post_init__()
        self.git = find_git()

    def routes(self) -> Sequence[BaseRoute]:
        return [Route("/{path:path}", self.backend, methods=["GET", "POST"])]

    def authorized(self, headers: Headers) -> bool:
        pair = basic_credentials(headers)
        return pair is not None and pair[0] == self.username and same_secret(pair[1], self.secret)

    def unauthorized(self, request: Request) -> Response:
        return PlainTextResponse("Authentication required\n", 401,
                                 {"www-authenticate": f'Basic realm="{REALM}"'})

    def refusal(self, request: Request) -> Response | None:
        """The static secret, or an installation token with contents read (fetch) or write (push)
        on the repository, as GitHub answers git: 404 for a repository outside the token."""
        if self.authorized(request.headers):
            return None
        pair = basic_credentials(request.headers)
        parts = request.url.path.split("/")
        if self.app is None or pair is None or len(parts) < 3:
            return self.unauthorized(request)
        push = "git-receive-pack" in (request.url.path + request.url.query)
        refused = self.app.check(pair[1], parts[1], parts[2].removesuffix(".git"), "contents",
                                 "write" if push else "read")
        if refused is None:
            return None
        if refused.status == 401:
            return self.unauthorized(request)
        text = "Repository not found.\n" if refused.status == 404 else (
            f"Permission to {parts[1]}/{parts[2]} denied to valetkey-demo[bot].\n")
        return PlainTextResponse(text, refused.status)

    def cgi_env(self, request: Request, body: bytes) -> dict[str, str]:
        env = {
            **_git_env(self.project_root),
            "GIT_PROJECT_ROOT": str(self.project_root), "GIT_HTTP_EXPORT_ALL": "1",
            "REMOTE_USER": self.username, "REMOTE_ADDR": request.client.host if request.client else "",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": f"HTTP/{request.scope.get('http_version', '1.1')}",
            "REQUEST_METHOD": request.method, "PATH_INFO": request.url.path,
            "QUERY_STRING": request.scope["query_string"].decode("latin-1"),
            "CONTENT_TYPE": request.headers.get("content-type", ""), "CONTENT_LENGTH": str(len(body)),
        }
        for name, value in request.headers.items():  # Git-Protocol, Content-Encoding, User-Agent…
            if name not in NOT_PASSED:
                env["HTTP_" + name.upper().replace("-", "_")] = value
        return env

    async def backend(self, request: Request) -> Response:
        body = await request.body()
        proc = await asyncio.create_subprocess_exec(
            self.git, "http-backend", env=self.cgi_env(request, body),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
        if stdin is None or stdout is None or stderr is None:
            proc.kill()
            raise ServiceError("git http-backend started without its pipes")
        feeder = asyncio.create_task(_feed(stdin, body))
        errors = asyncio.create_task(stderr.read())
        try:
            status, headers = await _cgi_head(stdout)
        except ValueError as exc:
            await _finish(proc, feeder, errors)
            return PlainTextResponse(f"git http-backend failed: {exc}\n", 500)
        return StreamingResponse(_body(proc, stdout, feeder, errors), status, headers)


async def _feed(stdin: asyncio.StreamWriter, body: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(body)
        await stdin.drain()
    stdin.close()


async def _cgi_head(stdout: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The CGI response header block: ``Status:`` becomes the status, the rest are headers."""
    status, size = 200, 0
    headers: dict[str, str] = {}
    while True:
        line = await stdout.readline()
        size += len(line)
        if not line or size > CGI_HEAD_LIMIT:
            raise ValueError("no complete CGI header block")
        text = line.decode("latin-1").rstrip("\r\n")
        if not text:
            return status, headers
        name, sep, value = text.partition(":")
        if not sep:
            raise ValueError(f"malformed CGI header line {text[:80]!r}")
        if name.strip().lower() == "status":
            status = int(value.split()[0])
        else:
            headers[name.strip().lower()] = value.strip()


async def _body(proc: asyncio.subprocess.Process, stdout: asyncio.StreamReader,
                feeder: asyncio.Task[None], errors: asyncio.Task[bytes]) -> AsyncIterator[bytes]:
    try:
        while chunk := await stdout.read(64 * 1024):
            yield chunk
    finally:
        await _finish(proc, feeder, errors)


async def _finish(proc: asyncio.subprocess.Process, feeder: asyncio.Task[None],
                  errors: asyncio.Task[bytes]) -> None:
    if proc.returncode is None:
        try:
            await asyncio.wait_for(proc.wait(), timeout=10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    await feeder
    stderr = await errors
    if proc.returncode or stderr:
        log.warning("git http-backend exited %s: %s", proc.returncode, stderr.decode(errors="replace")[-500:])
