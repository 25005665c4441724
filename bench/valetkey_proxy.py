"""The valetkey egress proxy for table 7: a bench stack of its own (OpenBao, Redis, broker with
``VALETKEY_PROXY_URL``) whose policy adds a credentialed TLS upstream (``benchtls``, host
``API_HOST``: terminated, the secret injected) and two tunnel destinations (``TUNNEL_HOST``, the
same upstream; ``BULK_HOST``, the bulk server), then ``valetkey proxy serve`` and one run minted
with all of them. The names resolve through the proxy's test-only resolver map
(``VALETKEY_PROXY_TEST_RESOLVE``); upstream TLS is verified against the test CA.

The proxy reads Vault with the dev root token here (the bench measures speed, not the narrow
AppRole ``valetkey vault bootstrap`` gives it in a deployment).
"""

from __future__ import annotations

import base64
import importlib.util
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.egress_procs import wait_port
from bench.stack import BenchStack
from bench.testca import API_HOST, BULK_HOST, TUNNEL_HOST, TestCA
from valetkey.dev.services import free_port

EGRESS_POLICY = """---
version: 1
kind: upstream
name: benchtls
base_url: https://{api}:{port}
allow_private: true
secret: {{path: valetkey/bench/benchtls, field: token}}
inject: {{header: Authorization, format: "Bearer {{secret}}"}}
env: {{placeholder: BENCHTLS_TOKEN, base_url: BENCHTLS_URL}}
purposes:
  read:
    why: Read items (the small request).
    methods: [GET]
    paths: ["/v1/items/{{item}}"]
  write:
    why: Write items (the medium request).
    methods: [POST]
    paths: ["/v1/items/{{item}}"]
    limits: {{max_body: 1MiB, rate: "100000000 per 1m"}}
---
version: 1
kind: destination
name: benchtunnel
description: The TLS upstream again, as a tunnel.
why: Table 7 measures tunnel mode against the same upstream.
host: {tunnel}
ports: [{port}]
tls: tunnel
allow_private: true
---
version: 1
kind: destination
name: benchbulk
description: The bulk server.
why: Table 7 measures bulk transfer through a tunnel.
host: {bulk}
ports: [{bulk_port}]
tls: tunnel
allow_private: true
"""
ALLOW = {"benchtls": ["read", "write"], "benchtunnel": ["connect"], "benchbulk": ["connect"]}
GRANTS = [{"upstream": "benchtls", "purpose": "read"}, {"upstream": "benchtls", "purpose": "write"},
          {"upstream": "benchtunnel", "purpose": "connect"}, {"upstream": "benchbulk", "purpose": "connect"}]


def missing() -> str | None:
    """Why the valetkey proxy cannot run from this checkout, or None when it can."""
    if importlib.util.find_spec("proxy") is None:
        return "the valetkey proxy (package proxy/) is not in this checkout"
    done = subprocess.run([sys.executable, "-m", "valetkey.cli", "proxy", "serve", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        return f"`valetkey proxy serve` is not available ({done.stderr.strip()[-200:]})"
    return None


@dataclass
class ValetkeyProxy:
    """The started proxy: ``port``, ``pid``, ``client_ca`` (the bundle's CA file), ``proxy_auth``,
    ``placeholder`` (what the client sends for the secret) and ``secret`` (what the upstream wants)."""

    port: int
    pid: int
    client_ca: Path
    proxy_auth: str
    placeholder: str
    secret: str


def _ensure_ca(stack: BenchStack, ca: TestCA) -> None:
    """The deployment CA in Vault (``valetkey vault bootstrap`` writes one; an older bootstrap
    does not, and then the bench writes its own, EC P-256 as the proxy requires)."""
    import hvac

    if stack.vault is None:
        raise RuntimeError("stack not started")
    client = hvac.Client(url=stack.vault.addr, token=stack.vault.root_token)
    try:
        client.secrets.kv.v2.read_secret_version(path="valetkey/proxy/ca", mount_point="secret",
                                                 raise_on_deleted_version=True)
    except hvac.exceptions.InvalidPath:
        cert, key = ca.ca.read_text(), ca.ca_key.read_text()
        client.secrets.kv.v2.create_or_update_secret(path="valetkey/proxy/ca", mount_point="secret",
                                                     secret={"cert": cert, "key": key})
        client.secrets.kv.v2.create_or_update_secret(path="valetkey/proxy/ca-public", mount_point="secret",
                                                     secret={"certs": cert})


def start(scope: ExitStack, ca: TestCA, deployment_ca: TestCA, tls_port: int, bulk_port: int,
          workdir: Path) -> ValetkeyProxy:
    """The stack and the proxy, entered into ``scope``; the TLS upstream and bulk server are the
    caller's (started on ``tls_port`` / ``bulk_port`` once the secret is known)."""
    port = free_port()
    policy = EGRESS_POLICY.format(api=API_HOST, tunnel=TUNNEL_HOST, bulk=BULK_HOST, port=tls_port,
                                  bulk_port=bulk_port)
    stack = scope.enter_context(BenchStack(gateways=0, extra_policy=policy, extra_allow=ALLOW,
                                           broker_env={"VALETKEY_PROXY_URL": f"http://127.0.0.1:{port}"}))
    if stack.vault is None:
        raise RuntimeError("stack not started")
    _ensure_ca(stack, deployment_ca)
    resolve = ",".join(f"{host}:{p}=127.0.0.1:{p}" for host, p in
                       ((API_HOST, tls_port), (TUNNEL_HOST, tls_port), (BULK_HOST, bulk_port)))
    argv = [sys.executable, "-m", "valetkey.cli", "proxy", "serve", "--log-level", "warning"]
    proc = stack.spawn("proxy", argv,
                       {**stack.common_env, "VAULT_TOKEN": stack.vault.root_token,
                        "VALETKEY_BROKER_URL": stack.broker_url, "VALETKEY_PROXY_LISTEN": f"127.0.0.1:{port}",
                        "VALETKEY_UPSTREAM_CA_FILE": str(ca.ca), "VALETKEY_PROXY_TEST_RESOLVE": resolve})
    wait_port(port, proc, seconds=60)
    bundle = stack.mint(grants=GRANTS)
    env = bundle["env"]
    proxy_url = urlsplit(env["HTTPS_PROXY"])
    files = bundle.get("files") or {}
    client_ca = workdir / "bundle-ca.pem"
    client_ca.write_text("".join(files.values()) if files else deployment_ca.ca.read_text())
    credential = base64.b64encode(f"{proxy_url.username}:{proxy_url.password}".encode()).decode()
    return ValetkeyProxy(port=port, pid=proc.pid, client_ca=client_ca, proxy_auth=f"Basic {credential}",
                         placeholder=env["BENCHTLS_TOKEN"], secret=stack.vault.secrets["benchtls"])
