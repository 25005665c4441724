"""End-to-end fixtures: the demo upstreams (``valetkey.dev.demo``) behind real gateways, minted for by a
real broker, with the demo policies — and clients run as subprocesses with only a run bundle's env.

The stack has its own OpenBao dev server: the demo upstreams are named like the shipped ones
(openai, github…), and bootstrapping them into the session Vault would rewrite the shipped
gateways' ACL policies under the other tests. Redis is the session one (run ids are unique).
A missing binary (bao, redis-server, git, curl) fails the tests; nothing is skipped.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from broker.app import create_app
from broker.settings import BrokerSettings
from gateways.app import GatewayApp
from gateways.server import GatewayProtocol
from gateways.settings import GatewaySettings
from policies.load import load_policy_dir
from policies.model import PolicySet
from tests.support.servers import ThreadedServer
from valetkey.dev.demo.policies import DEMO_RUNTIME, demo_grants, write_demo_policies
from valetkey.dev.demo.servers import DemoUpstreams, allocate_ports, start_demo_upstreams
from valetkey.dev.services import OpenBaoDev, RedisServer, free_port
from valetkey.dev.vault_seed import DevVault

AUDIT_STREAM = "valetkey:audit"
AUDIT_SCAN = 5000  # the newest lines of the session-wide stream; a test's own lines are among them
CLIENT_TIMEOUT = 60


@dataclass
class Stack:
    vault: DevVault
    policies: PolicySet
    broker_url: str
    redis_url: str
    demo: DemoUpstreams
    gateways: dict[str, ThreadedServer]

    def secret(self, upstream: str) -> str:
        return self.vault.secrets[upstream]

    def mint(self, upstreams: tuple[str, ...], ttl: str = "10m") -> dict[str, Any]:
        """A run bundle for ``demo-agent`` granting every demo purpose of ``upstreams``."""
        response = httpx.post(
            f"{self.broker_url}/v1/runs", json={"grants": demo_grants(upstreams), "ttl": ttl},
            headers={"X-Vault-Token": self.vault.runtime_token(DEMO_RUNTIME)}, timeout=10,
        )
        response.raise_for_status()
        bundle: dict[str, Any] = response.json()
        return bundle

    def audit(self, run_id: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The audit lines (kind=request) of ``run_id``, once at least ``count`` have arrived."""
        return self._audit(lambda entry: entry.get("run") == run_id, count, timeout)

    def audit_request(self, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The one audit line of a request, by the ``x-valetkey-request-id`` the client got."""
        return self._audit(lambda entry: request_id in entry.get("line", ""), 1, timeout)[0]

    def _audit(self, match: Any, count: int, timeout: float) -> list[dict[str, Any]]:
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        deadline = time.monotonic() + timeout
        try:
            while True:
                entries = [fields for _, fields in client.xrevrange(AUDIT_STREAM, count=AUDIT_SCAN)]
                lines = [json.loads(e["line"]) for e in entries if e.get("kind") == "request" and match(e)]
                if len(lines) >= count or time.monotonic() > deadline:
                    return lines[::-1]
                time.sleep(0.05)
        finally:
            client.close()


@dataclass(frozen=True)
class Ran:
    """One client process: its argv, exit code and everything it printed."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def require_binary(name: str) -> str:
    """The path of ``name``; a missing client binary fails the test with how to install it."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"`{name}` is not on PATH; the end-to-end tests need it "
                    f"(Debian: apt-get install -y {name}; ./scripts/test installs it as root)")
    return found


def sandbox_env(bundle: Mapping[str, Any], home: Path, **extra: str) -> dict[str, str]:
    """What a sandboxed agent has: the run bundle's env, a PATH and an empty HOME; nothing else."""
    home.mkdir(parents=True, exist_ok=True)
    return {**bundle["env"], "PATH": os.environ.get("PATH", os.defpath), "HOME": str(home),
            "LANG": "C.UTF-8", **extra}


def run_client(argv: list[str], env: Mapping[str, str], cwd: Path | None = None) -> Ran:
    done = subprocess.run(argv, env=dict(env), cwd=cwd, capture_output=True, text=True,
                          timeout=CLIENT_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
    return Ran(argv, done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="session")
def e2e_stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_binary("git")  # the git demo upstream runs `git http-backend`
    workdir = tmp_path_factory.mktemp("e2e")
    ports = allocate_ports()
    write_demo_policies(workdir / "policies", ports)
    policies = load_policy_dir(workdir / "policies")
    with OpenBaoDev() as bao:
        vault = DevVault.create(bao.addr, bao.root_token, policies)
        broker_url = f"http://127.0.0.1:{free_port()}"
        gateway_ports = {name: free_port() for name in policies.upstreams}
        settings = BrokerSettings.from_env({
            "VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.broker_token, "VALETKEY_REDIS_URL": redis_server.url,
            "VALETKEY_POLICY_DIR": str(workdir / "policies"), "VALETKEY_ISSUER": broker_url,
            "VALETKEY_GATEWAY_URLS": ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in gateway_ports.items()),
        })
        demo = start_demo_upstreams(vault.secrets, workdir / "demo", ports)
        broker = ThreadedServer(create_app(settings, policies), port=int(broker_url.rsplit(":", 1)[1]))
        gateways: dict[str, ThreadedServer] = {}
        try:
            broker.start()
            for name, port in gateway_ports.items():
                gateway_settings = GatewaySettings.from_env(name, {
                    "VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.gateway_token(name),
                    "VALETKEY_REDIS_URL": redis_server.url, "VALETKEY_BROKER_URL": broker_url,
                    "VALETKEY_ISSUER": broker_url, "VALETKEY_READ_TIMEOUT": "20s",
                })
                app = GatewayApp(gateway_settings, policies.upstreams[name], alerting=policies.alerting)
                gateways[name] = ThreadedServer(app, port=port, http=GatewayProtocol)
                gateways[name].start()
            yield Stack(vault, policies, broker_url, redis_server.url, demo, gateways)
        finally:
            for gateway in gateways.values():
                gateway.stop()
            broker.stop()
            demo.stop()


MARKER = "[REDACTED:valetkey]"


def secret_forms(secret: str) -> list[str]:
    """The secret and the encodings a client could receive it in unnoticed."""
    return [secret, base64.b64encode(secret.encode()).decode(),
            base64.b64encode(f"x-access-token:{secret}".encode()).decode()]


def assert_never_saw(secret: str, *texts: str) -> None:
    """No text the client printed or received carries the real secret, plain or base64."""
    for text in texts:
        for form in secret_forms(secret):
            assert form not in text, "the client saw the real secret"


def files_with(root: Path, secret: str) -> list[Path]:
    """Files under ``root`` (a client's HOME or work tree, ``.git`` included) holding the secret."""
    needles = [form.encode() for form in secret_forms(secret)]
    return [p for p in root.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]
