"""A GitHub-like REST API: one repository's metadata, its issues, comments on an issue, and a
debug endpoint that echoes the request headers back (to show the gateway redacting an echo).

Authentication is ``Authorization: Bearer <token>`` (or GitHub's older ``token <token>``); only
the real secret is accepted, anything else gets GitHub's ``Bad credentials`` 401. The data lives
in memory: ``acme/widgets`` with two open issues, unless other repositories are given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from valetkey.dev.demo.common import DemoUpstream, bearer_token, json_response, same_secret
from valetkey.dev.demo.github_app import AppInstallation

DEMO_OWNER = "acme"
DEMO_REPO = "widgets"
DOCS = "https://docs.github.com/rest"
DEMO_ISSUES = (
    ("Widgets render upside down on Tuesdays", "Steps to reproduce: wait for Tuesday."),
    ("Add a dark mode", "The widgets are too bright at night."),
)


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _not_found() -> Response:
    return json_response({"message": "Not Found", "documentation_url": DOCS, "status": "404"}, 404)


@dataclass
class Repository:
    owner: str
    name: str
    id: int
    issues: list[dict[str, Any]] = field(default_factory=list)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"

    def as_json(self, base: str) -> dict[str, Any]:
        return {
            "id": self.id, "node_id": f"R_demo{self.id}", "name": self.name, "full_name": self.full_name,
            "private": False, "owner": {"login": self.owner, "id": 1000 + self.id, "type": "Organization"},
            "html_url": f"https://github.com/{self.full_name}", "description": "A valetkey demo repository",
            "url": f"{base}/repos/{self.full_name}", "default_branch": "main",
            "open_issues_count": sum(1 for i in self.issues if i["state"] == "open"),
            "permissions": {"admin": False, "push": True, "pull": True},
        }


def _permission(method: str, rest: list[str]) -> tuple[str, str]:
    """The GitHub App permission an endpoint under /repos/{owner}/{repo} needs."""
    if rest and rest[0] == "issues":
        return "issues", "read" if method in ("GET", "HEAD") else "write"
    if rest and rest[0] in ("contents", "commits"):
        return "contents", "read" if method in ("GET", "HEAD") else "write"
    if rest and rest[0] == "pulls":
        return "pull_requests", "read" if method in ("GET", "HEAD") else "write"
    return "metadata", "read"


def demo_repositories() -> dict[str, Repository]:
    repo = Repository(DEMO_OWNER, DEMO_REPO, 1)
    for number, (title, body) in enumerate(DEMO_ISSUES, start=1):
        repo.issues.append({"id": 100 + number, "number": number, "title": title, "body": body,
                            "state": "open", "user": {"login": "octocat"}, "comments": 0,
                            "labels": [], "created_at": "2025-01-01T00:00:00Z"})
        repo.comments[number] = []
    return {repo.full_name: repo}


@dataclass
class GitHubLike(DemoUpstream):
    repositories: dict[str, Repository] = field(default_factory=demo_repositories)
    app: AppInstallation | None = None  # a GitHub App installed here: its tokens are honoured too
    _next_comment: int = field(default=5000, init=False)

    def routes(self) -> Sequence[BaseRoute]:
        return [
            Route("/repos/{owner}/{repo}", self.repository, methods=["GET", "HEAD"]),
            Route("/repos/{owner}/{repo}/issues", self.issues, methods=["GET"]),
            Route("/repos/{owner}/{repo}/issues/{number:int}", self.issue, methods=["GET"]),
            Route("/repos/{owner}/{repo}/issues/{number:int}/comments", self.comments,
                  methods=["GET", "POST"]),
            Route("/repos/{owner}/{repo}/debug/headers", self.debug_headers, methods=["GET"]),
            Route("/app/installations/{installation}/access_tokens", self.access_tokens,
                  methods=["POST"]),
            Route("/installation/token", self.revoke_token, methods=["DELETE"]),
        ]

    def refusal(self, request: Request) -> Response | None:
        """The static secret, or an App installation token allowed the route's permission on the
        repository (GitHub's permission per endpoint; metadata is implied)."""
        path = request.url.path
        if self.app is not None and (path.startswith("/app/") or path == "/installation/token"):
            return None  # authenticated by the endpoint itself (App JWT, the token to revoke)
        if self.authorized(request.headers):
            return None
        parts = path.split("/")
        if self.app is None or len(parts) < 4 or parts[1] != "repos":
            return self.unauthorized(request)
        permission, level = _permission(request.method, parts[4:])
        refused = self.app.check(bearer_token(request.headers, ("bearer", "token")), parts[2], parts[3],
                                 permission, level)
        if refused is None:
            return None
        return json_response({"message": refused.message, "documentation_url": DOCS,
                              "status": str(refused.status)}, refused.status)

    async def access_tokens(self, request: Request) -> Response:
        if self.app is None:
            return _not_found()
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            return json_response({"message": "Problems parsing JSON", "documentation_url": DOCS,
                                  "status": "400"}, 400)
        status, answer = self.app.create_token(bearer_token(request.headers),
                                               request.path_params["installation"], body)
        return json_response(answer, status)

    async def revoke_token(self, request: Request) -> Response:
        if self.app is None or not self.app.revoke(bearer_token(request.headers, ("bearer", "token"))):
            return self.unauthorized(request)
        return Response(status_code=204)

    def authorized(self, headers: Headers) -> bool:
        return same_secret(bearer_token(headers, ("bearer", "token")), self.secret)

    def unauthorized(self, request: Request) -> Response:
        return json_response({"message": "Bad credentials", "documentation_url": DOCS, "status": "401"}, 401)

    def _repo(self, request: Request) -> Repository | None:
        return self.repositories.get(f"{request.path_params['owner']}/{request.path_params['repo']}")

    @staticmethod
    def _base(request: Request) -> str:
        return f"{request.url.scheme}://{request.url.netloc}"

    async def repository(self, request: Request) -> Response:
        repo = self._repo(request)
        return json_response(repo.as_json(self._base(request))) if repo else _not_found()

    async def issues(self, request: Request) -> Response:
        repo = self._repo(request)
        if repo is None:
            return _not_found()
        state = request.query_params.get("state", "open")
        return json_response([i for i in repo.issues if state == "all" or i["state"] == state])

    async def issue(self, request: Request) -> Response:
        repo = self._repo(request)
        number = request.path_params["number"]
        found = next((i for i in repo.issues if i["number"] == number), None) if repo else None
        return json_response(found) if found else _not_found()

    async def comments(self, request: Request) -> Response:
        repo = self._repo(request)
        number = request.path_params["number"]
        if repo is None or number not in repo.comments:
            return _not_found()
        if request.method == "GET":
            return json_response(repo.comments[number])
        try:
            body = json.loads(await request.body())
        except ValueError:
            return json_response({"message": "Problems parsing JSON", "documentation_url": DOCS,
                                  "status": "400"}, 400)
        if not isinstance(body, dict) or not isinstance(body.get("body"), str) or not body["body"]:
            return json_response({"message": "Invalid request.\n\n\"body\" wasn't supplied.",
                                  "documentation_url": DOCS, "status": "422"}, 422)
        self._next_comment += 1
        comment = {
            "id": self._next_comment, "body": body["body"], "user": {"login": "valetkey-demo-bot"},
            "created_at": _stamp(), "updated_at": _stamp(),
            "url": f"{self._base(request)}/repos/{repo.full_name}/issues/comments/{self._next_comment}",
            "html_url": f"https://github.com/{repo.full_name}/issues/{number}#issuecomment-{self._next_comment}",
        }
        repo.comments[number].append(comment)
        for issue in repo.issues:
            if issue["number"] == number:
                issue["comments"] += 1
        return json_response(comment, 201, {"location": comment["url"]})

    async def debug_headers(self, request: Request) -> Response:
        """Echo every request header, credentials included: the leak the gateway must redact."""
        if self._repo(request) is None:
            return _not_found()
        headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in request.scope["headers"]]
        return json_response({"method": request.method, "path": request.url.path, "headers": headers})
