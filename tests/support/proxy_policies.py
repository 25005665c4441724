"""The policy set of the proxy end-to-end tests: the demo upstreams at their real names, two plain
destinations for a package index (one terminated, one tunnelled), an npm registry (terminated), a
wildcard destination (``*.docs.example``, tunnelled), one name that resolves to the metadata
address, and a runtime allowed all of it.

Every name resolves to loopback through the proxy's test resolver map, so each one says
``allow_private: true``; the metadata address stays refused whatever a policy says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.npm_registry import NPM_HOST, NPM_PACKAGE
from tests.support.package_index import FILES_HOST
from valetkey.dev.demo.policies import ALERTS, demo_grants, upstream_documents

# credentialed upstreams (the demo apps) at the hosts their clients use by default
UPSTREAM_HOSTS = {"openai": "api.openai.com", "anthropic": "api.anthropic.com", "github": "api.github.com",
                  "github-git": "github.com"}
INDEX_HOST = "pypi.org"
METADATA_HOST = "docs.intranet.test"  # resolved to 169.254.169.254 by the test resolver map
MIRROR_HOST = "mirror.pkgs.example"  # plain http (port 80): the index again, without TLS
DOCS_WILDCARD = "*.docs.example"  # a wildcard destination: one or more labels before docs.example
# test servers under the wildcard (a name, a deeper name) and its apex, which it does not match
DOCS_HOSTS = {"docs-a": "a.docs.example", "docs-deep": "deep.b.docs.example", "docs-apex": "docs.example"}
RUNTIME = "proxy-agent"
RUNTIME_POLICY = f"valetkey-runtime-{RUNTIME}"
# the one purpose of each plain destination (a tunnel's is always `connect`)
DESTINATION_PURPOSE = {"pypi": "install", "pythonhosted": "connect", "intranet": "connect", "mirror": "install",
                       "npm": "install", "docs": "connect"}


def destination_documents() -> dict[str, dict[str, Any]]:
    common = {"version": 1, "kind": "destination", "ports": [443], "allow_private": True}
    install = {"install": {"why": "Read the simple index.", "methods": ["GET", "HEAD"],
                           "paths": ["/simple/{package}/"]}}
    return {
        "pypi": {**common, "name": "pypi", "description": "The package index pages (terminated).",
                 "why": "Install Python packages the task needs.", "host": INDEX_HOST, "tls": "terminate",
                 "purposes": install},
        "mirror": {**common, "name": "mirror", "description": "A plain-http mirror of the index.",
                   "why": "Plain http follows the same rules.", "host": MIRROR_HOST, "ports": [80],
                   "tls": "terminate", "purposes": install},
        "pythonhosted": {**common, "name": "pythonhosted", "description": "Package files (tunnelled).",
                         "why": "Download the files the index links to.", "host": FILES_HOST, "tls": "tunnel"},
        "npm": {**common, "name": "npm", "description": "The npm registry (terminated).",
                "why": "Install JavaScript packages the task needs.", "host": NPM_HOST, "tls": "terminate",
                # an allowlist of packages: a bare `/{package}` would match every one-segment path
                "purposes": {"install": {"why": "Read the allowed packages' documents and tarballs.",
                                         "methods": ["GET", "HEAD"],
                                         "paths": [f"/{NPM_PACKAGE}", f"/{NPM_PACKAGE}/-/{{tarball}}"]}}},
        "docs": {**common, "name": "docs", "description": "Every documentation host under docs.example.",
                 "why": "Read documentation.", "host": DOCS_WILDCARD, "tls": "tunnel"},
        "intranet": {**common, "name": "intranet", "description": "A name that resolves to the metadata address.",
                     "why": "Proves the egress guard judges the resolved address.", "host": METADATA_HOST,
                     "tls": "tunnel"},
    }


def upstream_proxy_documents() -> dict[str, dict[str, Any]]:
    docs = upstream_documents(dict.fromkeys(UPSTREAM_HOSTS, 443))
    for name, doc in docs.items():
        doc["base_url"] = f"https://{UPSTREAM_HOSTS[name]}"
    return docs


def write_proxy_policies(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    upstreams, destinations = upstream_proxy_documents(), destination_documents()
    runtime = {
        "version": 1, "kind": "runtime", "name": RUNTIME,
        "description": "A sandbox whose only way out is the proxy.",
        "identity": {"vault_policy": RUNTIME_POLICY}, "max_ttl": "1h", "max_grants": 32,
        "allow": {**{name: sorted(doc["purposes"]) for name, doc in upstreams.items()},
                  **{name: [purpose] for name, purpose in DESTINATION_PURPOSE.items()}},
    }
    documents = {**upstreams, **destinations, RUNTIME: runtime, "alerts": ALERTS}
    for name, doc in documents.items():
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def proxy_grants(*names: str) -> list[dict[str, Any]]:
    """Grants for ``POST /v1/runs``: every demo purpose of the named upstreams, the one purpose of
    the named destinations."""
    upstreams = tuple(n for n in names if n in UPSTREAM_HOSTS)
    grants = demo_grants(upstreams) if upstreams else []
    return grants + [{"upstream": n, "purpose": DESTINATION_PURPOSE[n], "params": {}}
                     for n in names if n in DESTINATION_PURPOSE]
