"""The proxy's own stack, in process: real OpenBao and Redis, a broker, TLS echo upstreams under
real-looking names, the deployment CA in Vault, and the proxy under uvicorn with its protocol.

Runs are minted by the broker (the credentialed upstream's placeholder); the proxy credential for
the same run is signed here by Vault transit exactly as the broker signs, so these tests do not
depend on how the broker bundles it.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import hvac
import pytest

from broker.app import create_app
from broker.settings import BrokerSettings
from broker.signer import TransitSigner
from contract.ca import CA_PUBLIC_PATH
from contract.claims import AccessClaims, GrantClaim
from contract.secret import Secret
from contract.vault import VaultClient
from policies.load import load_policy_dir
from policies.model import PolicySet
from proxy.app import ProxyApp
from proxy.protocol import ProxyProtocol
from proxy.settings import ProxySettings, parse_connect_to
from tests.support.certs import make_ca, make_leaf
from tests.support.servers import ThreadedServer
from tests.support.upstreams import EchoUpstream
from valetkey.dev.services import OpenBaoDev, RedisServer
from valetkey.dev.vault_seed import DevVault

ISSUER = "http://broker.proxy-tests.valetkey.test"
API = "api.echo.test"  # a credentialed upstream
DOCS = "docs.example.test"  # a terminated destination
TUN = "tun.example.test"  # a tunnelled destination
META = "meta.example.test"  # an allowed name that resolves to the metadata address
ASK = "one.ask.example.test"  # no destination names it; runtime asker may ask about *.ask.example.test
ASK_PLAIN = "plain.ask.example.test"  # the same, plain http
ASK_META = "meta.ask.example.test"  # the same, resolving to the metadata address
ASK_DENIED = "denied.ask.example.test"  # the enterprise denies it: never asked about
UPSTREAM = f"""version: 1
kind: upstream
name: secure
base_url: https://{API}
allow_private: true
secret: {{path: valetkey/tests/secure, field: value}}
inject: {{header: Authorization, format: 'Bearer {{secret}}'}}
env: {{placeholder: SECURE_TOKEN, base_url: SECURE_URL}}
purposes:
  read_items:
    why: Read items.
    methods: [GET]
    paths: ["/v1/items", "/v1/items/{{item}}"]
"""
RUNTIME = """version: 1
kind: runtime
name: tester
identity: {vault_policy: valetkey-runtime-tester}
max_ttl: 1h
max_grants: 16
allow:
  secure: [read_items]
  docs: [read]
  tun: [connect]
  meta: [read]
  plain: [read]
"""
ASKERS = """version: 1
kind: runtime
name: asker
identity: {vault_policy: valetkey-runtime-asker}
allow:
  secure: [read_items]
unlisted_hosts:
  ask: ["*.ask.example.test"]
  ports: [443, 80]
  timeout: 60s
  max_body: 1KiB
  allow_private: true
---
version: 1
kind: runtime
name: asker-quick
identity: {vault_policy: valetkey-runtime-asker-quick}
allow:
  secure: [read_items]
unlisted_hosts:
  ask: ["*.ask.example.test"]
  timeout: 2s
  allow_private: true
"""
ENTERPRISE = f"""version: 1
kind: enterprise
deny:
  - host: {ASK_DENIED}
    why: A paste site is never reached from a sandbox.
"""


DESTINATIONS = f"""version: 1
kind: destination
name: docs
why: Read docs.
host: {DOCS}
tls: terminate
allow_private: true
purposes:
  read:
    why: Read pages.
    methods: [GET]
    paths: [/docs, "/docs/{{page}}"]
---
version: 1
kind: destination
name: tun
why: Tunnel.
host: {TUN}
tls: tunnel
allow_private: true
---
version: 1
kind: destination
name: meta
why: Metadata behind a name.
host: {META}
tls: terminate
allow_private: true
purposes:
  read:
    why: Read.
    methods: [GET]
    paths: [/docs]
---
version: 1
kind: destination
name: plain
why: Plain http.
host: plain.example.test
ports: [80]
tls: terminate
allow_private: true
purposes:
  read:
    why: Read pages.
    methods: [GET]
    paths: [/docs, "/docs/{{page}}"]
"""


@dataclass
class ProxyStack:
    vault: DevVault
    policies: PolicySet
    broker_url: str
    redis_url: str
    proxy_port: int
    upstream_ca: Path  # what the test upstreams' certificates chain to
    proxy_ca: Path  # the deployment CA the proxy mints leaves from
    echoes: dict[str, EchoUpstream]
    servers: list[ThreadedServer] = field(default_factory=list)

    def mint(self, destinations: list[str], ttl: str = "10m", runtime: str = "tester") -> tuple[str, str, str]:
        """A run: (run id, the upstream placeholder, the proxy credential)."""
        token = self.vault.runtime_token(runtime)
        grant = {"upstream": "secure", "purpose": "read_items"}
        response = httpx.post(f"{self.broker_url}/v1/runs", headers={"X-Vault-Token": token},
                              json={"grants": [grant], "ttl": ttl})
        response.raise_for_status()
        bundle = response.json()
        run_id = bundle["run_id"]
        grants = tuple(GrantClaim(g, MappingProxyType({})) for g in destinations)
        claims = AccessClaims.new(issuer=ISSUER, run_id=run_id, audience="egress", runtime=runtime,
                                  grants=grants, now=int(time.time()), ttl=600)
        proxy_token = asyncio.run(_sign(self.vault.addr, self.vault.broker_token, claims))
        return run_id, bundle["env"].get("SECURE_TOKEN", ""), proxy_token

    def end(self, run_id: str) -> None:
        httpx.delete(f"{self.broker_url}/v1/runs/{run_id}",
                     headers={"X-Vault-Token": self.vault.admin_token}).raise_for_status()

    def proxy_url(self, token: str) -> str:
        return f"http://run:{token}@127.0.0.1:{self.proxy_port}"

    def client(self, token: str) -> httpx.Client:
        """An unmodified httpx client: the proxy from a URL, the deployment CA as its trust."""
        return httpx.Client(proxy=self.proxy_url(token), verify=ssl.create_default_context(cafile=str(self.proxy_ca)),
                            timeout=10)


async def _sign(addr: str, token: str, claims: AccessClaims) -> str:
    vault = VaultClient(addr, Secret(token))
    try:
        signed = await TransitSigner(vault, "transit", "valetkey-tokens").sign([claims])
    finally:
        await vault.aclose()
    return signed[0]


def basic(token: str) -> str:
    return "Basic " + base64.b64encode(f"run:{token}".encode()).decode()


@pytest.fixture(scope="session")
def proxy_stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyStack]:
    with OpenBaoDev() as bao:
        policy_dir = tmp_path_factory.mktemp("proxy-policies")
        (policy_dir / "secure.yaml").write_text(UPSTREAM)
        (policy_dir / "tester.yaml").write_text(RUNTIME)
        (policy_dir / "destinations.yaml").write_text(DESTINATIONS)
        (policy_dir / "askers.yaml").write_text(ASKERS)
        (policy_dir / "enterprise.yaml").write_text(ENTERPRISE)
        policies = load_policy_dir(policy_dir)
        dev = DevVault.create(bao.addr, bao.root_token, policies)
        certs = tmp_path_factory.mktemp("proxy-certs")
        upstream_ca, ca_key, ca = make_ca(certs)
        deploy = tmp_path_factory.mktemp("deploy-ca")
        proxy_ca = deploy / "ca.pem"  # the CA bootstrap created: what a bundle's CA file carries
        client = hvac.Client(url=bao.addr, token=bao.root_token)
        proxy_ca.write_text(client.secrets.kv.v2.read_secret_version(
            path=CA_PUBLIC_PATH, mount_point="secret", raise_on_deleted_version=True)["data"]["data"]["certs"])
        echoes: dict[str, EchoUpstream] = {}
        servers: list[ThreadedServer] = []
        resolve: list[str] = []
        for name, host in (("secure", API), ("docs", DOCS), ("tun", TUN), ("ask", ASK)):
            placement = "header:authorization:Bearer {secret}" if name == "secure" else "open"
            echo = EchoUpstream(placement, secret=dev.secrets.get(name, ""))
            cert, key = make_leaf(certs, ca_key, ca, host)
            server = ThreadedServer(echo, http=echo.protocol(), ssl_certfile=str(cert), ssl_keyfile=str(key))
            echo.port = server.port
            echoes[name] = echo
            servers.append(server.start())
            resolve.append(f"{host}:443=127.0.0.1:{server.port}")
        plain = EchoUpstream("open", secret="")
        plain_server = ThreadedServer(plain, http=plain.protocol())
        echoes["plain"] = plain
        servers.append(plain_server.start())
        resolve.append(f"plain.example.test:80=127.0.0.1:{plain_server.port}")
        ask_plain = EchoUpstream("open", secret="")
        ask_plain_server = ThreadedServer(ask_plain, http=ask_plain.protocol())
        echoes["ask-plain"] = ask_plain
        servers.append(ask_plain_server.start())
        resolve.append(f"{ASK_PLAIN}:80=127.0.0.1:{ask_plain_server.port}")
        resolve.append(f"{ASK_META}:443=169.254.169.254:443")
        resolve.append(f"{META}:443=169.254.169.254:443")
        broker = ThreadedServer(create_app(BrokerSettings.from_env({
            "VAULT_ADDR": dev.addr, "VAULT_TOKEN": dev.broker_token, "VALETKEY_REDIS_URL": redis_server.url,
            "VALETKEY_POLICY_DIR": str(policy_dir), "VALETKEY_ISSUER": ISSUER}), policies)).start()
        servers.append(broker)
        port = _free_port()
        settings = ProxySettings.from_env({
            "VAULT_ADDR": dev.addr, "VAULT_TOKEN": bao.root_token, "VALETKEY_REDIS_URL": redis_server.url,
            "VALETKEY_BROKER_URL": broker.url, "VALETKEY_ISSUER": ISSUER, "VALETKEY_READ_TIMEOUT": "5s",
            "VALETKEY_UPSTREAM_CA_FILE": str(upstream_ca), "VALETKEY_PROXY_LISTEN": f"127.0.0.1:{port}",
            "VALETKEY_PROXY_HELLO_TIMEOUT": "1s", "VALETKEY_PROXY_CA_REFRESH": "1s",
            "VALETKEY_PROXY_TEST_RESOLVE": ",".join(resolve)})
        assert parse_connect_to(",".join(resolve))
        proxy = ThreadedServer(ProxyApp(settings, policies), port=port, http=ProxyProtocol).start()
        servers.append(proxy)
        stack = ProxyStack(dev, policies, broker.url, redis_server.url, port, upstream_ca, proxy_ca, echoes, servers)
        try:
            yield stack
        finally:
            for server in reversed(servers):
                server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def connect_raw(stack: ProxyStack, authority: str, headers: dict[str, str]) -> tuple[socket.socket, bytes]:
    """Send a CONNECT by hand; returns the socket and the response head."""
    sock = socket.create_connection(("127.0.0.1", stack.proxy_port), timeout=5)
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    # latin-1: a header value may carry any byte (hostile-input cases send bytes outside ASCII)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{lines}\r\n".encode("latin-1"))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(65536)
        if not chunk:
            break
        head += chunk
    return sock, head


def json_body(head: bytes) -> dict[str, Any]:
    import json

    _, _, body = head.partition(b"\r\n\r\n")
    value: dict[str, Any] = json.loads(body) if body else {}
    return value
