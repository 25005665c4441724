"""The valetkey egress proxy for table 7: a bench stack of its own (OpenBao, Redis, broker with
``VALETKEY_PROXY_URL``) whose policy adds a credentialed TLS upstream (``benchtls``, host
``API_HOST``: terminated, the secret injected) and two tunnel destinations (``TUNNEL_HOST``, the
same upstream; ``BULK_HOST``, the bulk server), then ``valetkey proxy serve`` and one run minted
with all of them. The names resolve through the proxy's test-only resolver map
(``VALETKEY_PROXY_TEST_RESOLVE``); upstream TLS is verified against the test CA.

The proxy reads Vault with its own identity (policy ``valetkey-proxy``: the CA and the upstream
secrets); ``valetkey vault bootstrap`` created the deployment CA. When the broker does not bundle
a proxy credential yet (no ``HTTPS_PROXY`` in the run's env), the bench signs one for the same
run with the broker's transit key, exactly as the broker signs (audience ``egress``, grants
``<name>/<purpose>``), as tests/proxy does.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

import httpx
import hvac

from bench.egress_procs import wait_port
from bench.stack import ISSUER, BenchStack
from bench.testca import API_HOST, BULK_HOST, TUNNEL_HOST, TestCA
from broker.signer import TransitSigner
from contract.ca import CA_PUBLIC_PATH, KV_MOUNT, public_certs
from contract.claims import AccessClaims, GrantClaim
from contract.secret import Secret
from contract.vault import VaultClient
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
    token_from: str  # "broker bundle" or "signed by the bench"


async def _sign(stack: BenchStack, run_id: str) -> str:
    if stack.vault is None:
        raise RuntimeError("stack not started")
    grants = tuple(GrantClaim(f"{g['upstream']}/{g['purpose']}", MappingProxyType({})) for g in GRANTS)
    claims = AccessClaims.new(issuer=ISSUER, run_id=run_id, audience="egress", runtime="bench-agent",
                              grants=grants, now=int(time.time()), ttl=3600)
    vault = VaultClient(stack.vault.addr, Secret(stack.vault.broker_token))
    try:
        return (await TransitSigner(vault, "transit", "valetkey-tokens").sign([claims]))[0]
    finally:
        await vault.aclose()


def _deployment_ca(stack: BenchStack) -> str:
    if stack.vault is None:
        raise RuntimeError("stack not started")
    client = hvac.Client(url=stack.vault.addr, token=stack.vault.root_token)
    read = client.secrets.kv.v2.read_secret_version(path=CA_PUBLIC_PATH, mount_point=KV_MOUNT,
                                                    raise_on_deleted_version=True)
    return public_certs(read["data"]["data"])


def start(scope: ExitStack, ca: TestCA, tls_port: int, bulk_port: int, workdir: Path) -> ValetkeyProxy:
    """The stack and the proxy, entered into ``scope``; the TLS upstream and bulk server are the
    caller's (started on ``tls_port`` / ``bulk_port`` once the secret is known)."""
    port = free_port()
    policy = EGRESS_POLICY.format(api=API_HOST, tunnel=TUNNEL_HOST, bulk=BULK_HOST, port=tls_port,
                                  bulk_port=bulk_port)
    stack = scope.enter_context(BenchStack(gateways=0, extra_policy=policy, extra_allow=ALLOW,
                                           broker_env={"VALETKEY_PROXY_URL": f"http://127.0.0.1:{port}"}))
    if stack.vault is None:
        raise RuntimeError("stack not started")
    resolve = ",".join(f"{host}:{p}=127.0.0.1:{p}" for host, p in
                       ((API_HOST, tls_port), (TUNNEL_HOST, tls_port), (BULK_HOST, bulk_port)))
    argv = [sys.executable, "-m", "valetkey.cli", "proxy", "serve", "--log-level", "warning"]
    proc = stack.spawn("proxy", argv,
                       {**stack.common_env, "VAULT_TOKEN": stack.vault.proxy_token(),
                        "VALETKEY_BROKER_URL": stack.broker_url, "VALETKEY_PROXY_LISTEN": f"127.0.0.1:{port}",
                        "VALETKEY_UPSTREAM_CA_FILE": str(ca.ca), "VALETKEY_PROXY_TEST_RESOLVE": resolve})
    try:
        wait_port(port, proc, seconds=60)
    except RuntimeError as exc:
        log = (stack.workdir / "proxy.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{exc}: {log}") from None
    try:
        bundle = stack.mint(grants=GRANTS)
    except httpx.HTTPStatusError as exc:  # a broker that does not grant destinations yet
        if exc.response.status_code != 400:
            raise
        bundle = stack.mint(grants=[g for g in GRANTS if g["upstream"] == "benchtls"])
    env = bundle["env"]
    client_ca = workdir / "bundle-ca.pem"
    files = bundle.get("files") or {}
    client_ca.write_text("".join(files.values()) if files else _deployment_ca(stack))
    if env.get("HTTPS_PROXY"):
        url = urlsplit(env["HTTPS_PROXY"])
        user, token, token_from = url.username or "run", url.password or "", "broker bundle"
    else:
        user, token, token_from = "run", asyncio.run(_sign(stack, bundle["run_id"])), "signed by the bench"
    credential = base64.b64encode(f"{user}:{token}".encode()).decode()
    return ValetkeyProxy(port=port, pid=proc.pid, client_ca=client_ca, proxy_auth=f"Basic {credential}",
                         placeholder=env["BENCHTLS_TOKEN"], secret=stack.vault.secrets["benchtls"],
                         token_from=token_from)
