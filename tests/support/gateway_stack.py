"""Gateway fixtures: real echo upstreams, a policy written for their ports, a bootstrapped Vault,
a broker minting for those upstreams, and one in-process gateway per upstream under uvicorn."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import redis

from broker.app import create_app
from broker.settings import BrokerSettings
from contract import generation
from gateways.app import GatewayApp
from gateways.server import GatewayProtocol
from gateways.settings import GatewaySettings
from policies.load import load_policy_dir
from policies.model import PolicySet
from tests.support.certs import make_ca, make_leaf
from tests.support.rawhttp import RawUpstream
from tests.support.servers import ThreadedServer
from tests.support.upstreams import EchoUpstream
from valetkey.dev.services import OpenBaoDev, RedisServer, free_port
from valetkey.dev.vault_seed import DevVault

ISSUER = "http://broker.gateway-tests.valetkey.test"
PLACEMENTS = {
    "echo": ("inject: {header: Authorization, format: 'Bearer {secret}'}", "header:authorization:Bearer {secret}"),
    "keyed": ("inject: {header: x-api-key}", "header:x-api-key:{secret}"),
    "gitbasic": ("inject: {basic: {username: x-access-token}}", "basic:x-access-token"),
    "queried": ("inject: {query: key}", "query:key"),
}
PURPOSES = """
purposes:
  read_items:
    why: Read items.
    methods: [GET, HEAD]
    paths: ["/v1/items", "/v1/items/{item}", "/v1/items/{item}/redirect-home",
            "/v1/items/{item}/redirect-away", "/v1/sse", "/v1/slow"]
  write_item:
    why: Update one bound item.
    methods: [POST, PUT]
    params: [item]
    paths: ["/v1/items/{item}"]
    limits: {max_body: 1KiB}
  limited:
    why: A rate-limited read.
    methods: [GET]
    paths: ["/v1/limited"]
    limits: {rate: "5 per 1m"}
  upload:
    why: Upload blobs of any type.
    methods: [POST]
    paths: [/v1/blobs]
    limits: {max_body: 64KiB}
    allow_fields: [password]
  publish:
    why: Publish one item (irreversible, a tester approves).
    methods: [POST]
    paths: [/v1/publish, /v1/publish/forbidden]
    limits: {max_body: 64KiB}
    approval: required
    approvers: testers
  publish_fast:
    why: Publish, with a short wait for approval (the security team only).
    methods: [POST]
    paths: [/v1/publish-fast]
    approval: required
    approval_timeout: 2s
"""
ENTERPRISE = """version: 1
kind: enterprise
approvers:
  testers: {vault_policy: valetkey-approvers-testers}
deny:
  - {upstream: echo, methods: [POST], paths: [/v1/publish/forbidden], why: Never published.}
"""


def _policy(name: str, base_url: str, inject: str, allow_private: bool = True) -> str:
    limits = "run_limits: {requests: 4}\n" if name == "queried" else ""
    return (f"version: 1\nkind: upstream\nname: {name}\nbase_url: {base_url}\n{limits}"
            f"allow_private: {str(allow_private).lower()}\n"
            f"secret: {{path: valetkey/tests/{name}, field: value}}\n{inject}\n"
            f"env: {{placeholder: {name.upper()}_TOKEN, base_url: {name.upper()}_URL}}\n{PURPOSES}")


TLS_HOST = "api.valetkey.test"
BEARER = PLACEMENTS["echo"][0]
# upstreams whose gateways the tests start themselves: TLS good and bad, refused egress, nobody home
EXTRA = {"tlsgood": TLS_HOST, "tlsbad": "other.valetkey.test", "nolocal": "", "gone": ""}


RUNTIME = """version: 1
kind: runtime
name: tester
identity: {vault_policy: valetkey-runtime-tester}
max_ttl: 1h
max_grants: 16
allow:
  echo: [read_items, write_item, upload, limited, publish, publish_fast]
  keyed: [read_items, write_item]
  gitbasic: [read_items]
  queried: [read_items]
  tlsgood: [read_items]
  tlsbad: [read_items]
  nolocal: [read_items]
  gone: [read_items]
  rawleak: [read_items]
"""


@dataclass
class Stack:
    vault: DevVault
    policies: PolicySet
    broker_url: str
    redis_url: str
    upstreams: dict[str, EchoUpstream]
    ca_file: Path
    gateways: dict[str, ThreadedServer] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # each gateway's operator listener
    raw: RawUpstream | None = None  # upstream "rawleak": a bare HTTP/1.1 server (gateway started by tests)

    def app(self, name: str) -> GatewayApp:
        app: GatewayApp = self.gateways[name].server.config.app
        return app

    def url(self, name: str) -> str:
        return self.gateways[name].url

    def metrics(self, name: str) -> str:
        """Prometheus text from the gateway's operator listener (never its sandbox-facing port)."""
        return httpx.get(f"http://127.0.0.1:{self.metrics_ports[name]}/metrics").text

    def mint(self, grants: list[dict[str, Any]], ttl: str = "10m") -> dict[str, Any]:
        token = self.vault.runtime_token("tester")
        response = httpx.post(f"{self.broker_url}/v1/runs", json={"grants": grants, "ttl": ttl},
                              headers={"X-Vault-Token": token})
        response.raise_for_status()
        bundle: dict[str, Any] = response.json()
        return bundle

    def end(self, run_id: str) -> None:
        httpx.delete(f"{self.broker_url}/v1/runs/{run_id}",
                     headers={"X-Vault-Token": self.vault.admin_token}).raise_for_status()


def gateway_settings(stack: Stack, name: str, **extra: str) -> GatewaySettings:
    env = {"VAULT_ADDR": stack.vault.addr, "VAULT_TOKEN": stack.vault.gateway_token(name),
           "VALETKEY_REDIS_URL": stack.redis_url, "VALETKEY_BROKER_URL": stack.broker_url,
           "VALETKEY_ISSUER": ISSUER, "VALETKEY_READ_TIMEOUT": "1s", **extra}
    return GatewaySettings.from_env(name, env)


async def loopback_resolver(host: str, port: int) -> list[tuple[Any, ...]]:
    """DNS seam: the test hostnames resolve to loopback (allowed only with allow_private)."""
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


class HasRedis(Protocol):
    redis_url: str


def audit_line(stack: HasRedis, request_id: str) -> dict[str, Any]:
    client = redis.Redis.from_url(stack.redis_url)
    try:
        for _ in range(100):
            for _, fields in client.xrevrange("valetkey:audit", count=500):
                line: dict[str, Any] = json.loads(fields[b"line"])
                if line.get("request_id") == request_id and "decision" in line:  # not an alert line
                    return line
            time.sleep(0.05)
    finally:
        client.close()
    raise AssertionError(f"no audit line for {request_id}")


def generation_started(redis_url: str) -> None:
    """What a broker does first on a Redis it serves (broker/revocation_keeper.py): start the
    generation marker, without which a gateway neither starts nor serves. For tests that run a
    gateway on a Redis of their own, with no broker on it."""
    with redis.Redis.from_url(redis_url) as client:
        client.set(generation.KEY, json.dumps({"id": "tests", "since": time.time()}), nx=True)


def start_gateway(stack: Stack, name: str, **extra: str) -> ThreadedServer:
    app = GatewayApp(gateway_settings(stack, name, **extra), stack.policies.upstreams[name],
                     resolver=loopback_resolver, enterprise=stack.policies.enterprise)
    return ThreadedServer(app, http=GatewayProtocol).start()


@pytest.fixture(scope="session")
def gateway_vault() -> Iterator[OpenBaoDev]:
    """The gateway stack's own OpenBao: its bootstrap with the test policies never meets the
    shipped-policy bootstrap the broker and tooling tests check, whichever runs first."""
    with OpenBaoDev() as server:
        yield server


@pytest.fixture(scope="session")
def gateway_stack(gateway_vault: OpenBaoDev, redis_server: RedisServer,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    vault = gateway_vault
    policy_dir = tmp_path_factory.mktemp("gateway-policies")
    echoes: dict[str, EchoUpstream] = {}
    held: list[socket.socket] = []
    servers: list[ThreadedServer] = []
    for name, (inject, placement) in PLACEMENTS.items():
        echo = EchoUpstream(placement, secret="")
        server = ThreadedServer(echo, http=echo.protocol())
        echo.port = server.port
        (policy_dir / f"{name}.yaml").write_text(_policy(name, f"http://127.0.0.1:{server.port}", inject))
        echoes[name] = echo
        servers.append(server)
    ca_file, ca_key, ca = make_ca(tmp_path_factory.mktemp("ca"))
    for name, cert_host in EXTRA.items():
        echo = EchoUpstream(PLACEMENTS["echo"][1], secret="")
        if cert_host:
            cert, key = make_leaf(ca_file.parent, ca_key, ca, cert_host)
            server = ThreadedServer(echo, http=echo.protocol(), ssl_certfile=str(cert), ssl_keyfile=str(key))
            base_url = f"https://{TLS_HOST}:{server.port}"
        elif name == "nolocal":
            server = ThreadedServer(echo, http=echo.protocol())
            base_url = f"http://localhost:{server.port}"
        else:
            # a socket bound for the whole session but never listening: connections are refused,
            # and no other test server can be given this port meanwhile
            closed = socket.socket()
            closed.bind(("127.0.0.1", 0))
            held.append(closed)
            server = ThreadedServer(echo, port=closed.getsockname()[1])  # never started
            base_url = f"http://127.0.0.1:{server.port}"
        echo.port = server.port
        (policy_dir / f"{name}.yaml").write_text(_policy(name, base_url, BEARER, name != "nolocal"))
        echoes[name] = echo
        if name != "gone":
            servers.append(server)
    raw = RawUpstream().start()
    (policy_dir / "rawleak.yaml").write_text(_policy("rawleak", f"http://127.0.0.1:{raw.port}", BEARER))
    (policy_dir / "tester.yaml").write_text(RUNTIME)
    (policy_dir / "enterprise.yaml").write_text(ENTERPRISE)
    policies = load_policy_dir(policy_dir)
    dev = DevVault.create(vault.addr, vault.root_token, policies)
    for name, echo in echoes.items():
        echo.secret = dev.secrets[name]
    for server in servers:
        server.start()
    settings = BrokerSettings.from_env({
        "VAULT_ADDR": dev.addr, "VAULT_TOKEN": dev.broker_token, "VALETKEY_REDIS_URL": redis_server.url,
        "VALETKEY_POLICY_DIR": str(Path(policy_dir)), "VALETKEY_ISSUER": ISSUER,
    })
    broker = ThreadedServer(create_app(settings, policies)).start()
    stack = Stack(dev, policies, broker.url, redis_server.url, echoes, ca_file, raw=raw)
    try:
        for name in PLACEMENTS:
            stack.metrics_ports[name] = free_port()
            stack.gateways[name] = start_gateway(
                stack, name, VALETKEY_METRICS_LISTEN=f"127.0.0.1:{stack.metrics_ports[name]}")
        yield stack
    finally:
        for gateway in stack.gateways.values():
            gateway.stop()
        broker.stop()
        for server in servers:
            server.stop()
        raw.stop()
        for sock in held:
            sock.close()
