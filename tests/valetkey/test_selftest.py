"""`valetkey selftest` inside a sandbox the test builds (a network namespace whose only way out is
a veth to the gateways' address), where every check must pass; and once without isolation, where
the bypass and private-address checks must fail with evidence.

Every address used is the test's own: loopback, and 10.211.x.0/30 inside the namespace pair.
The namespace has no default route, so probes of 169.254.169.254 and 10.0.0.1 never leave it.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.app import create_app
from broker.settings import BrokerSettings
from gateways.app import GatewayApp
from gateways.server import GatewayProtocol
from tests.support.asgi import read_body
from tests.support.gateway_stack import ISSUER, Stack, gateway_settings, loopback_resolver
from tests.support.servers import ThreadedServer

VALETKEY = str(Path(sys.executable).parent / "valetkey")


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@dataclass
class Receiver:
    alerts: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["method"] == "POST":
            self.alerts.append(json.loads(body))
            payload = b""
        else:
            payload = json.dumps({"alerts": self.alerts}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": payload})


class FakeResolver:
    """A real UDP DNS responder on loopback: answers every query (the 'outside resolver')."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                data, peer = self.sock.recvfrom(512)
            except OSError:
                continue
            header = data[:2] + struct.pack(">HHHHH", 0x8180, 1, 0, 0, 0)
            self.sock.sendto(header + data[12:], peer)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


@dataclass
class Sandbox:
    netns: str
    host_ip: str
    broker: str
    receiver: str
    resolver: int
    outside: str
    stack: Stack

    def bundle(self, tmp: Path) -> Path:
        response = httpx.post(f"{self.broker}/v1/runs", headers={"X-Vault-Token": self.stack.vault.runtime_token("tester")},
                              json={"grants": [{"upstream": "echo", "purpose": "read_items"},
                                               {"upstream": "keyed", "purpose": "read_items"}]})
        response.raise_for_status()
        path = tmp / f"bundle-{secrets.token_hex(4)}.env"
        path.write_text(response.json()["dotenv"])
        return path

    def selftest(self, tmp: Path, isolated: bool, probes: list[str]) -> tuple[int, list[dict[str, Any]], str]:
        home = tmp / "home"
        home.mkdir(exist_ok=True)
        argv = [VALETKEY, "selftest", "--env-file", str(self.bundle(tmp)), "--json", "--timeout", "1",
                "--resolver", f"127.0.0.1:{self.resolver}", "--outside-url", self.outside,
                "--alert-check-url", f"{self.receiver}/alerts", *[a for p in probes for a in ("--probe", p)]]
        if isolated:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
        done = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=120, check=False)
        return done.returncode, json.loads(done.stdout or "[]"), done.stderr


@pytest.fixture(scope="module")
def sandbox(gateway_stack: Stack) -> Iterator[Sandbox]:
    if os.geteuid() != 0:
        raise RuntimeError("the sandbox self-test needs root for ip netns (CI runs as root)")
    tag = secrets.token_hex(3)
    octet = 100 + secrets.randbelow(150)
    netns, host_if, sbx_if = f"vk-sbx-{tag}", f"vkh{tag}", f"vks{tag}"
    host_ip, sbx_ip = f"10.211.{octet}.1", f"10.211.{octet}.2"
    sh("ip", "netns", "add", netns)
    servers: list[ThreadedServer] = []
    resolver = FakeResolver()
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", sbx_if)
        sh("ip", "link", "set", sbx_if, "netns", netns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "netns", "exec", netns, "ip", "addr", "add", f"{sbx_ip}/30", "dev", sbx_if)
        sh("ip", "netns", "exec", netns, "ip", "link", "set", sbx_if, "up")
        sh("ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up")
        receiver = ThreadedServer(Receiver(), host=host_ip).start()
        outside = ThreadedServer(Receiver()).start()  # an 'outside' web server on the host's loopback
        servers += [receiver, outside]
        gateways = {}
        for name in ("echo", "keyed"):
            settings = gateway_settings(gateway_stack, name, VALETKEY_ALERT_WEBHOOK_URL=f"{receiver.url}/hook",
                                        VALETKEY_ALERT_WEBHOOK_SECRET="whsec-selftest")
            app = GatewayApp(settings, gateway_stack.policies.upstreams[name], resolver=loopback_resolver,
                             alerting=gateway_stack.policies.alerting)
            server = ThreadedServer(app, http=GatewayProtocol, host=host_ip).start()
            servers.append(server)
            gateways[name] = server.url
        policy_dir = Path(gateway_stack.policies.upstreams["echo"].source).parent
        settings = BrokerSettings.from_env({
            "VAULT_ADDR": gateway_stack.vault.addr, "VAULT_TOKEN": gateway_stack.vault.broker_token,
            "VALETKEY_REDIS_URL": gateway_stack.redis_url, "VALETKEY_POLICY_DIR": str(policy_dir),
            "VALETKEY_ISSUER": ISSUER, "VALETKEY_GATEWAY_URLS": ",".join(f"{k}={v}" for k, v in gateways.items()),
        })
        broker = ThreadedServer(create_app(settings, gateway_stack.policies)).start()
        servers.append(broker)
        yield Sandbox(netns, host_ip, broker.url, receiver.url, resolver.port, f"{outside.url}/", gateway_stack)
    finally:
        for server in reversed(servers):
            server.stop()
        resolver.close()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


def _by_number(results: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["number"]: r for r in results}


def test_selftest_passes_inside_the_isolated_sandbox(sandbox: Sandbox, tmp_path: Path) -> None:
    redis_port = sandbox.stack.redis_url.rsplit(":", 1)[1].split("/")[0]
    vault_port = sandbox.stack.vault.addr.rsplit(":", 1)[1]
    probes = [f"127.0.0.1:{redis_port}", f"127.0.0.1:{vault_port}", "169.254.169.254:80", "10.0.0.1:80",
              "[::1]:80"]
    code, results, stderr = sandbox.selftest(tmp_path, isolated=True, probes=probes)
    checks = _by_number(results)
    assert sorted(checks) == [1, 2, 3, 4, 5, 6, 7], stderr
    failed = {n: r["evidence"] for n, r in checks.items() if not r["passed"]}
    print(render_results(results))
    assert not failed
    assert code == 0
    assert any("logged as request" in e for e in checks[2]["evidence"])
    assert any("receiver got" in e for e in checks[6]["evidence"])
    assert any("audience_mismatch" in e for e in checks[7]["evidence"])
    assert any("token_revoked" in e for e in checks[7]["evidence"])


def test_selftest_fails_with_evidence_without_isolation(sandbox: Sandbox, tmp_path: Path) -> None:
    redis_port = sandbox.stack.redis_url.rsplit(":", 1)[1].split("/")[0]
    code, results, _ = sandbox.selftest(tmp_path, isolated=False, probes=[f"127.0.0.1:{redis_port}"])
    checks = _by_number(results)
    assert code == 1
    assert not checks[1]["passed"]
    assert any("reachable directly" in e for e in checks[1]["evidence"])
    assert not checks[4]["passed"]
    assert any(f"127.0.0.1:{redis_port}: TCP connection accepted" in e for e in checks[4]["evidence"])


def test_selftest_flags_a_credential_file(sandbox: Sandbox, tmp_path: Path) -> None:
    from valetkey.selftest import Options, check_credentials

    home = tmp_path / "home"
    (home / ".config" / "gh").mkdir(parents=True)
    (home / ".config" / "gh" / "hosts.yml").write_text("github.com:\n  oauth_token: ghp_" + "x" * 36 + "\n")
    result = check_credentials(Options(env={"AWS_ACCESS_KEY_ID": "AKIA" + "B" * 16}, home=home,
                                       workspace=tmp_path))
    assert not result.passed
    joined = "\n".join(result.evidence)
    assert "hosts.yml" in joined
    assert "AWS_ACCESS_KEY_ID" in joined
    assert "x" * 36 not in joined


def render_results(results: list[dict[str, Any]]) -> str:
    from valetkey.selftest import Result, render

    return render([Result(**r) for r in results])
