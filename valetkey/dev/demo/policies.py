"""Policies for the demo upstreams: the shipped ones' names, env vars and placements, pointed at
local ports, plus a ``demo-agent`` runtime allowed every purpose and the default alerts.

git smart-HTTP paths: a client clones ``$GIT_BASE_URL/acme/widgets.git``, so git requests
``/acme/widgets.git/info/refs?service=git-upload-pack`` then ``POST /acme/widgets.git/git-upload-pack``
(``git-receive-pack`` to push). A template parameter is a whole path segment, so ``{repo}`` binds
``widgets.git`` — the ``.git`` suffix included, exactly as in the shipped ``github-git`` policy.
``demo_grants()`` binds it that way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from valetkey.dev.demo.github_like import DEMO_OWNER, DEMO_REPO

DEMO_UPSTREAMS = ("openai", "anthropic", "github", "github-git")
DEMO_RUNTIME = "demo-agent"
DEMO_RUNTIME_POLICY = "valetkey-runtime-demo-agent"
DEMO_ISSUE = 1


def _secret(name: str, field: str) -> dict[str, str]:
    # the demo's own KV paths: seeding demo secrets never overwrites a configured upstream's secret
    return {"mount": "secret", "path": f"valetkey/demo/{name}", "field": field}


def _purpose(why: str, methods: list[str], paths: list[str], params: list[str] | None = None,
             **limits: Any) -> dict[str, Any]:
    purpose: dict[str, Any] = {"why": why, "methods": methods, "paths": paths}
    if params:
        purpose["params"] = params
    if limits:
        purpose["limits"] = limits
    return purpose


def upstream_documents(ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    """One upstream policy document per demo upstream in ``ports``."""
    repo = ["owner", "repo"]
    docs: dict[str, dict[str, Any]] = {
        "openai": {
            "description": "Demo OpenAI-compatible API (valetkey.dev.demo.openai_like).",
            "secret": _secret("openai", "api_key"),
            "inject": {"header": "Authorization", "format": "Bearer {secret}"},
            "env": {"placeholder": "OPENAI_API_KEY", "base_url": "OPENAI_BASE_URL", "base_path": "/v1"},
            "purposes": {
                "chat": _purpose("Generate chat completions, streamed or not.", ["POST"],
                                 ["/v1/chat/completions"], max_body="4MiB"),
                "list_models": _purpose("List the models.", ["GET"], ["/v1/models", "/v1/models/{model}"]),
            },
        },
        "anthropic": {
            "description": "Demo Anthropic Messages API (valetkey.dev.demo.anthropic_like).",
            "secret": _secret("anthropic", "api_key"),
            # SDK 1.x sends x-api-key, 2.x Authorization: Bearer: accept both, inject x-api-key
            "inject": {"header": "x-api-key",
                       "accept": [{"header": "Authorization", "format": "Bearer {secret}"}]},
            "env": {"placeholder": "ANTHROPIC_API_KEY", "base_url": "ANTHROPIC_BASE_URL"},
            "purposes": {
                "messages": _purpose("Create messages, streamed or not, and count their tokens.", ["POST"],
                                     ["/v1/messages", "/v1/messages/count_tokens"], max_body="4MiB"),
                "list_models": _purpose("List the models.", ["GET"], ["/v1/models"]),
            },
        },
        "github": {
            "description": "Demo GitHub REST API (valetkey.dev.demo.github_like).",
            "secret": _secret("github", "token"),
            "inject": {"header": "Authorization", "format": "Bearer {secret}"},
            "env": {"placeholder": "GITHUB_TOKEN", "base_url": "GITHUB_API_URL"},
            "purposes": {
                "read_repo": _purpose("Read one repository's metadata.", ["GET", "HEAD"],
                                      ["/repos/{owner}/{repo}"], repo),
                "read_issues": _purpose("Read issues and their comments in one repository.", ["GET"], [
                    "/repos/{owner}/{repo}/issues", "/repos/{owner}/{repo}/issues/{number}",
                    "/repos/{owner}/{repo}/issues/{number}/comments"], repo),
                "comment_issue": _purpose("Post a comment on one bound issue.", ["POST"],
                                          ["/repos/{owner}/{repo}/issues/{number}/comments"],
                                          [*repo, "number"], max_body="64KiB", rate="10 per 10m"),
                "debug_headers": _purpose(
                    "Demo only: the upstream echoes the request headers, so the redaction shows.",
                    ["GET"], ["/repos/{owner}/{repo}/debug/headers"], repo),
                # irreversible: every request waits for a person (the console, `valetkey approvals`)
                "create_release": {**_purpose("Publish a release of one repository.", ["POST"],
                                              ["/repos/{owner}/{repo}/releases"], repo, max_body="64KiB"),
                                   "approval": "required", "approval_timeout": "10m"},
            },
        },
        "github-git": {
            "description": "Demo git smart-HTTP server (valetkey.dev.demo.git_http); {repo} = 'name.git'.",
            "secret": _secret("github-git", "token"),
            "inject": {"basic": {"username": "x-access-token"}},
            "env": {"placeholder": "GIT_PASSWORD", "base_url": "GIT_BASE_URL"},
            "purposes": {
                "clone": _purpose("Fetch one repository over git smart-HTTP.", ["GET", "POST"], [
                    "/{owner}/{repo}/info/refs", "/{owner}/{repo}/git-upload-pack"], repo),
                "push": _purpose("Push to one repository over git smart-HTTP.", ["GET", "POST"], [
                    "/{owner}/{repo}/info/refs", "/{owner}/{repo}/git-receive-pack"], repo,
                    max_body="100MiB", rate="20 per 1h"),
            },
        },
    }
    return {
        name: {"version": 1, "kind": "upstream", "name": name, "description": docs[name].pop("description"),
               "base_url": f"http://127.0.0.1:{port}", "allow_private": True, **docs[name]}
        for name, port in ports.items()
    }


def runtime_document(upstreams: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "version": 1, "kind": "runtime", "name": DEMO_RUNTIME,
        "description": "The demo sandbox: every purpose of every demo upstream.",
        "identity": {"vault_policy": DEMO_RUNTIME_POLICY}, "max_ttl": "1h", "max_grants": 16,
        "allow": {name: sorted(doc["purposes"]) for name, doc in upstreams.items()},
    }


ALERTS = {
    "version": 1, "kind": "alerts", "description": "The default thresholds, spelled out.",
    "thresholds": {
        "denial_burst": {"count": 10, "window": "1m"}, "probing": {"count": 5, "window": "5m"},
        "credential_passthrough": {"count": 1, "window": "1h"},
        "secret_echoed": {"count": 1, "window": "1h"}, "budget_exhausted": {"count": 1, "window": "1h"},
    },
    "auto_revoke": ["credential_passthrough", "denial_burst"],
}


def write_demo_policies(directory: Path, ports: dict[str, int]) -> None:
    """Write ``<upstream>.yaml`` for each demo upstream in ``ports`` (name → local port), the
    ``demo-agent`` runtime allowed all their purposes, and ``alerts.yaml`` with the defaults."""
    unknown = sorted(set(ports) - set(DEMO_UPSTREAMS))
    if unknown:
        raise ValueError(f"no demo upstream named {unknown}; known: {list(DEMO_UPSTREAMS)}")
    directory.mkdir(parents=True, exist_ok=True)
    upstreams = upstream_documents(ports)
    documents = {**upstreams, DEMO_RUNTIME: runtime_document(upstreams), "alerts": ALERTS}
    for name, doc in documents.items():
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def demo_grants(upstreams: tuple[str, ...] = DEMO_UPSTREAMS, owner: str = DEMO_OWNER,
                repo: str = DEMO_REPO, issue: int = DEMO_ISSUE) -> list[dict[str, Any]]:
    """Every purpose of the demo policies as grants for ``POST /v1/runs``, bound to one repository
    (and one issue for comments)."""
    bound = {"owner": owner, "repo": repo}
    table: dict[str, list[tuple[str, dict[str, str]]]] = {
        "openai": [("chat", {}), ("list_models", {})],
        "anthropic": [("messages", {}), ("list_models", {})],
        "github": [("read_repo", bound), ("read_issues", bound),
                   ("comment_issue", {**bound, "number": str(issue)}), ("debug_headers", bound),
                   ("create_release", bound)],
        "github-git": [("clone", {"owner": owner, "repo": f"{repo}.git"}),
                       ("push", {"owner": owner, "repo": f"{repo}.git"})],
    }
    return [{"upstream": name, "purpose": purpose, "params": params}
            for name in upstreams for purpose, params in table[name]]
