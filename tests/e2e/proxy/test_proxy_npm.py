"""npm, unmodified, through the egress proxy: ``npm install`` from an HTTPS registry at
``registry.npmjs.org`` (a local one, reached through the proxy's test resolver map), holding only
the run bundle's env. npm reads the proxy (with its ``run:TOKEN`` credential) from
``HTTPS_PROXY`` and trusts the deployment CA through ``npm_config_cafile`` (this machine's global
npmrc names the system store as ``cafile``, which hides ``NODE_EXTRA_CA_CERTS`` from npm, as in
many images); nothing else is configured for it. The destination is terminated with a purpose naming the allowed package: what npm asks
outside it (``npm ping``) is refused with the purpose's reason code, upstream never dialled for it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.conftest import require_binary, run_client
from tests.e2e.proxy.conftest import sandbox_for
from tests.support.npm_registry import NPM_GREETING, NPM_PACKAGE, NPM_VERSION, TARBALL_PATH
from tests.support.proxy_stack import ProxyStack

# no audit, funding or update checks: each would be one more (refused) request to the registry
QUIET = ["--no-audit", "--no-fund", "--no-update-notifier", "--loglevel", "http"]


def test_npm_install_through_proxy(stack: ProxyStack, tmp_path: Path) -> None:
    npm, node = require_binary("npm"), require_binary("node")
    bundle, box = sandbox_for(stack, tmp_path, "npm")
    registry = stack.upstreams["npm"].app
    before = len(registry.seen)
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "probe-app", "version": "1.0.0", "private": True}))

    installed = run_client([npm, "install", *QUIET, NPM_PACKAGE], box.env, cwd=project)
    assert installed.returncode == 0, installed.output[-3000:]
    required = run_client([node, "-e", f"console.log(require({NPM_PACKAGE!r}).greeting)"], box.env, cwd=project)
    assert required.stdout.strip() == NPM_GREETING, required.output[-2000:]
    lock = json.loads((project / "package-lock.json").read_text())
    assert lock["packages"][f"node_modules/{NPM_PACKAGE}"]["version"] == NPM_VERSION

    paths = [hit.path for hit in registry.seen[before:]]
    assert f"/{NPM_PACKAGE}" in paths, paths
    assert TARBALL_PATH in paths, paths
    # the proxy credential stays with the proxy: the registry never sees it
    assert not any(k == "proxy-authorization" for hit in registry.seen[before:] for k, _ in hit.headers)
    lines = stack.named_audit(bundle["run_id"], "npm", 3)
    assert {(x.get("method"), x.get("path"), x.get("decision")) for x in lines} >= {
        ("GET", f"/{NPM_PACKAGE}", "allow"), ("GET", TARBALL_PATH, "allow")}, lines


def test_npm_outside_the_purpose_refused(stack: ProxyStack, tmp_path: Path) -> None:
    npm = require_binary("npm")
    bundle, box = sandbox_for(stack, tmp_path, "npm")
    registry = stack.upstreams["npm"].app
    before = len(registry.seen)

    pinged = run_client([npm, "ping", *QUIET], box.env, cwd=tmp_path)

    assert pinged.returncode != 0
    assert "403" in pinged.output, pinged.output[-2000:]
    assert registry.seen[before:] == []
    lines = stack.named_audit(bundle["run_id"], "npm", 2)
    # the CONNECT's line is written when its tunnel ends, after the request's
    assert sorted((x.get("method"), x.get("path"), x.get("decision"), x.get("reason")) for x in lines) == [
        ("CONNECT", "registry.npmjs.org:443", "allow", "ok"),
        ("GET", "/-/ping", "deny", "purpose_not_granted")], lines
