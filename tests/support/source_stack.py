"""A stack for run-scoped credential sources: policies written by the test, a bootstrapped Vault
(its own OpenBao: the test upstreams' names are its own), a broker and one gateway per upstream.

The test starts its upstreams (demo GitHub with an App installation, an OAuth provider) first,
writes their policies, then ``SourceStack.start`` brings up Vault, the broker and the gateways.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from broker.app import create_app
from broker.settings import BrokerSettings
from gateways.app import GatewayApp
from gateways.server import GatewayProtocol
from gateways.settings import GatewaySettings
from policies.load import load_policy_dir
from policies.model import PolicySet
from tests.support.servers import ThreadedServer
from valetkey.dev.services import OpenBaoDev, RedisServer, free_port
from valetkey.dev.vault_seed import DevVault

ISSUER_PATH = "http://127.0.0.1:{port}"


def runtime_yaml(allow: dict[str, list[str]]) -> str:
    lines = "\n".join(f"  {up}: [{', '.join(purposes)}]" for up, purposes in allow.items())
    return ("version: 1\nkind: runtime\nname: tester\nidentity: {vault_policy: valetkey-runtime-tester}\n"
            f"max_ttl: 1h\nmax_grants: 16\nallow:\n{lines}\n")


@dataclass
class SourceStack:
    vault: DevVault
    policies: PolicySet
    broker_url: str
    redis_url: str
    gateways: dict[str, ThreadedServer] = field(default_factory=dict)
    gateway_env: dict[str, str] = field(default_factory=dict)

    def start_gateway(self, name: str, port: int | None = None) -> ThreadedServer:
        """A gateway for upstream ``name`` (another replica when one runs already)."""
        env = {"VAULT_ADDR": self.vault.addr, "VAULT_TOKEN": self.vault.gateway_token(name),
               "VALETKEY_REDIS_URL": self.redis_url, "VALETKEY_BROKER_URL": self.broker_url,
               "VALETKEY_ISSUER": self.broker_url, "VALETKEY_READ_TIMEOUT": "20s", **self.gateway_env}
        app = GatewayApp(GatewaySettings.from_env(name, env), self.policies.upstreams[name])
        return ThreadedServer(app, port=port or free_port(), http=GatewayProtocol).start()

    def url(self, name: str) -> str:
        return self.gateways[name].url

    def app(self, name: str) -> GatewayApp:
        app: GatewayApp = self.gateways[name].server.config.app
        return app

    def mint(self, grants: list[dict[str, Any]], ttl: str = "10m") -> dict[str, Any]:
        response = httpx.post(f"{self.broker_url}/v1/runs", json={"grants": grants, "ttl": ttl},
                              headers={"X-Vault-Token": self.vault.runtime_token("tester")}, timeout=10)
        response.raise_for_status()
        bundle: dict[str, Any] = response.json()
        return bundle

    def end(self, run_id: str) -> None:
        httpx.delete(f"{self.broker_url}/v1/runs/{run_id}",
                     headers={"X-Vault-Token": self.vault.admin_token}, timeout=10).raise_for_status()

    def audit(self, run_id: str) -> list[dict[str, Any]]:
        """The request audit lines of ``run_id`` written so far, oldest first."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            entries = client.xrevrange("valetkey:audit", count=5000)
        finally:
            client.close()
        return [json.loads(f["line"]) for _, f in reversed(entries)
                if f.get("kind") == "request" and f.get("run") == run_id]


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


@contextmanager
def source_stack(policy_dir: Path, redis: RedisServer, prepare: Callable[[DevVault], None],
                 gateway_env: dict[str, str] | None = None) -> Iterator[SourceStack]:
    """Bootstrap a fresh OpenBao for the policies in ``policy_dir``, let ``prepare`` write what the
    sources need (keys, clients), then start the broker and a gateway per upstream."""
    policies = load_policy_dir(policy_dir)
    with OpenBaoDev() as bao:
        vault = DevVault.create(bao.addr, bao.root_token, policies)
        prepare(vault)
        broker_port = free_port()
        broker_url = ISSUER_PATH.format(port=broker_port)
        ports = {name: free_port() for name in policies.upstreams}
        settings = BrokerSettings.from_env({
            "VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.broker_token, "VALETKEY_REDIS_URL": redis.url,
            "VALETKEY_POLICY_DIR": str(policy_dir), "VALETKEY_ISSUER": broker_url,
            "VALETKEY_GATEWAY_URLS": ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in ports.items()),
        })
        broker = ThreadedServer(create_app(settings, policies), port=broker_port)
        stack = SourceStack(vault, policies, broker_url, redis.url, gateway_env=dict(gateway_env or {}))
        try:
            broker.start()
            for name in policies.upstreams:
                stack.gateways[name] = stack.start_gateway(name, ports[name])
            yield stack
        finally:
            for gateway in stack.gateways.values():
                gateway.stop()
            broker.stop()
