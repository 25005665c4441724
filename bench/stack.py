"""Start and stop a whole valetkey stack on loopback for benchmarks: OpenBao dev, Redis, Vault
bootstrap, a fast upstream, the broker, and N gateway processes (each a real ``valetkey gateway
serve``). Everything is a child process and is stopped on exit."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from policies.load import load_policy_dir
from valetkey.dev.services import OpenBaoDev, RedisServer, free_port
from valetkey.dev.vault_seed import DevVault

ISSUER = "http://broker.bench.valetkey.test"
UPSTREAM = "bench"
POLICY = """version: 1
kind: upstream
name: bench
base_url: http://127.0.0.1:{port}
allow_private: true
secret: {{path: valetkey/bench/upstream, field: token}}
inject: {{header: Authorization, format: "Bearer {{secret}}"}}
env: {{placeholder: BENCH_TOKEN, base_url: BENCH_URL}}
purposes:
  read:
    why: Read items (the small request).
    methods: [GET]
    paths: ["/v1/items/{{item}}", "/v1/sse"]
  write:
    why: Write items (the medium request).
    methods: [POST]
    paths: ["/v1/items/{{item}}"]
    limits: {{max_body: 1MiB, rate: "100000000 per 1m"}}
---
version: 1
kind: runtime
name: bench-agent
identity: {{vault_policy: valetkey-runtime-bench-agent}}
max_ttl: 24h
max_grants: 8
allow:
  bench: [read, write]
"""


def wait_http(url: str, seconds: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready in {seconds}s")


@dataclass
class BenchStack:
    gateways: int = 1
    workers: int = 1
    env_extra: dict[str, str] = field(default_factory=dict)
    extra_policy: str = ""  # more YAML documents (table 7: the TLS upstream and tunnel destinations)
    extra_allow: dict[str, list[str]] = field(default_factory=dict)  # granted to bench-agent too
    broker_env: dict[str, str] = field(default_factory=dict)
    upstream_port: int = 0
    broker_url: str = ""
    gateway_urls: list[str] = field(default_factory=list)
    secret: str = ""
    vault: DevVault | None = None
    redis_url: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gateway_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    broker: subprocess.Popen[bytes] | None = None
    _common: dict[str, str] = field(default_factory=dict)
    _stack: ExitStack = field(default_factory=ExitStack)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="valetkey-bench-")))

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        self._stack.callback(log.close)
        proc = subprocess.Popen(  # noqa: S603 - our own argv
            argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        self.procs.append(proc)
        return proc

    def __enter__(self) -> BenchStack:
        vault = self._stack.enter_context(OpenBaoDev())
        redis = self._stack.enter_context(RedisServer())
        self.redis_url = redis.url
        self.upstream_port = free_port()
        policy_dir = self.workdir / "policies"
        policy_dir.mkdir()
        allow = "".join(f"  {name}: [{', '.join(purposes)}]\n" for name, purposes in self.extra_allow.items())
        text = POLICY.format(port=self.upstream_port) + allow + self.extra_policy
        (policy_dir / "bench.yaml").write_text(text)
        policies = load_policy_dir(policy_dir)
        self.vault = DevVault.create(vault.addr, vault.root_token, policies)
        self.secret = self.vault.secrets[UPSTREAM]
        upstream = self.spawn("upstream", [sys.executable, "-m", "bench.upstream", str(self.upstream_port),
                                           self.secret], {})
        wait_http(f"http://127.0.0.1:{self.upstream_port}/", proc=upstream)
        broker_port = free_port()
        self.broker_url = f"http://127.0.0.1:{broker_port}"
        self._common = {"VAULT_ADDR": vault.addr, "VALETKEY_REDIS_URL": redis.url, "VALETKEY_ISSUER": ISSUER,
                        "VALETKEY_POLICY_DIR": str(policy_dir)}
        self.broker = self.spawn("broker", [sys.executable, "-m", "valetkey.cli", "broker", "serve",
                                            "--log-level", "warning"],
                                 {**self._common, "VAULT_TOKEN": self.vault.broker_token,
                                  "VALETKEY_LISTEN": f"127.0.0.1:{broker_port}", **self.broker_env})
        wait_http(f"{self.broker_url}/readyz", proc=self.broker)
        for _ in range(self.gateways):
            self.add_gateway(self.workers)
        return self

    @property
    def common_env(self) -> dict[str, str]:
        """What every server of the stack is started with (Vault, Redis, issuer, policy dir)."""
        return dict(self._common)

    def add_gateway(self, workers: int) -> str:
        """Start one more ``valetkey gateway serve`` with ``workers`` worker processes; its URL."""
        if self.vault is None:
            raise RuntimeError("stack not started")
        port = free_port()
        env = {**self._common, "VAULT_TOKEN": self.vault.gateway_token(UPSTREAM),
               "VALETKEY_BROKER_URL": self.broker_url, "VALETKEY_LISTEN": f"127.0.0.1:{port}",
               **self.env_extra}
        proc = self.spawn(f"gateway-{len(self.gateway_procs)}",
                          [sys.executable, "-m", "valetkey.cli", "gateway", "serve", "--upstream", UPSTREAM,
                           "--workers", str(workers), "--log-level", "warning"], env)
        self.gateway_procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        self.gateway_urls.append(url)
        wait_http(f"{url}/.valetkey/readyz", seconds=90, proc=proc)  # workers start slowly on a busy box
        return url

    def mint(self, purposes: tuple[str, ...] = ("read", "write"), ttl: str = "1h",
             grants: list[dict[str, str]] | None = None) -> dict[str, Any]:
        if self.vault is None:
            raise RuntimeError("stack not started")
        if grants is None:
            grants = [{"upstream": UPSTREAM, "purpose": p} for p in purposes]
        response = httpx.post(f"{self.broker_url}/v1/runs", json={"grants": grants, "ttl": ttl},
                              headers={"X-Vault-Token": self.vault.runtime_token("bench-agent")})
        response.raise_for_status()
        bundle: dict[str, Any] = response.json()
        return bundle

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self.vault is None:
            raise RuntimeError("stack not started")
        return httpx.request(method, f"{self.broker_url}{path}",
                             headers={"X-Vault-Token": self.vault.admin_token}, timeout=10, **kwargs)

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._stack.close()
