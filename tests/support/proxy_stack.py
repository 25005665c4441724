"""The whole stack behind the egress proxy, for end-to-end tests with unmodified clients.

OpenBao (its own dev server: the upstreams are named like the shipped ones) bootstrapped the way
``valetkey vault bootstrap`` does it, so the deployment CA exists; the session redis-server; a
broker that names the proxy (``VALETKEY_PROXY_URL``, ``VALETKEY_EGRESS=proxy``); TLS upstreams for
the real-looking names; and ``valetkey proxy serve`` as a real process whose test-only resolver map
(``VALETKEY_PROXY_TEST_RESOLVE``) dials each name's loopback server and whose upstream TLS trusts
the test CA (``VALETKEY_UPSTREAM_CA_FILE``). A sandbox is a directory with the bundle's files and
an env of only the bundle's variables plus PATH and HOME.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from broker.app import create_app
from broker.settings import BrokerSettings
from policies.load import load_policy_dir
from tests.support.npm_registry import NPM_HOST, NpmRegistry
from tests.support.package_index import FILES_HOST, FileHost, Recording, SimpleIndex, build_wheel
from tests.support.proxy_policies import (
    DOCS_HOSTS,
    INDEX_HOST,
    METADATA_HOST,
    MIRROR_HOST,
    RUNTIME,
    UPSTREAM_HOSTS,
    proxy_grants,
    write_proxy_policies,
)
from tests.support.servers import ThreadedServer
from tests.support.tls_upstreams import TestCA, TlsServer
from valetkey.bootstrap import open_client
from valetkey.dev.demo.servers import build_app
from valetkey.dev.services import OpenBaoDev, free_port
from valetkey.dev.vault_seed import DevVault

AUDIT_STREAM = "valetkey:audit"
AUDIT_SCAN = 5000
PROXY_POLICY = "valetkey-proxy"  # the Vault policy bootstrap gives the proxy's identity
PROXY_START_TIMEOUT = 30.0
METADATA_ADDRESS = "169.254.169.254:443"


@dataclass
class Sandbox:
    """What an unmodified client holds: ``env`` (bundle env, PATH, HOME, LANG) and ``home``."""

    env: dict[str, str]
    home: Path
    files: dict[str, Path]


def make_sandbox(bundle: Mapping[str, Any], root: Path, **extra: str) -> Sandbox:
    """Write the bundle's ``files`` under ``root/files`` (as ``valetkey run --files-dir`` does) and
    point the env variables that named their paths at the written copies."""
    env = dict(bundle["env"])
    written: dict[str, Path] = {}
    for path, content in (bundle.get("files") or {}).items():
        target = root / "files" / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        written[path] = target
        env = {key: str(target) if value == path else value for key, value in env.items()}
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    env.update({"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home), "LANG": "C.UTF-8", **extra})
    return Sandbox(env, home, written)


@dataclass
class ProxyStack:
    vault: DevVault
    broker_url: str
    proxy_url: str
    redis_url: str
    ca: TestCA
    upstreams: dict[str, TlsServer]  # by policy name (upstreams and destinations)
    proxy: subprocess.Popen[bytes]
    proxy_log: Path
    git_root: Path
    proxy_env: dict[str, str] = field(default_factory=dict)  # what a further replica starts with
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def proxy_address(self) -> tuple[str, int]:
        host, _, port = self.proxy_url.removeprefix("http://").partition(":")
        return host, int(port)

    def secret(self, upstream: str) -> str:
        return self.vault.secrets[upstream]

    def log_tail(self, size: int = 4000) -> str:
        return self.proxy_log.read_text(errors="replace")[-size:]

    def mint_response(self, grants: list[dict[str, Any]], ttl: str = "10m") -> httpx.Response:
        return httpx.post(f"{self.broker_url}/v1/runs", json={"grants": grants, "ttl": ttl},
                          headers={"X-Vault-Token": self.vault.runtime_token(RUNTIME)}, timeout=10)

    def mint(self, *names: str, ttl: str = "10m") -> dict[str, Any]:
        """A run bundle granting every purpose of the named upstreams and destinations."""
        response = self.mint_response(proxy_grants(*names), ttl)
        assert response.is_success, response.text
        bundle: dict[str, Any] = response.json()
        return bundle

    def mint_cli(self, root: Path, *names: str) -> tuple[dict[str, Any], Sandbox]:
        """Mint with ``valetkey run create --files-dir root/files`` (the CLI a sandbox runtime
        uses) and build the sandbox from what it printed."""
        grants = [f"{g['upstream']}:{g['purpose']}" + (":" + ",".join(f"{k}={v}" for k, v in g["params"].items())
                                                         if g["params"] else "") for g in proxy_grants(*names)]
        argv = [sys.executable, "-c", "from valetkey.cli import main; main()", "run", "create",
                "--broker", self.broker_url, "--files-dir", str(root / "files"), "--format", "json"]
        for grant in grants:
            argv += ["--grant", grant]
        done = subprocess.run(argv, env={"PATH": os.environ.get("PATH", os.defpath),
                                         "VAULT_TOKEN": self.vault.runtime_token(RUNTIME)},
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        bundle: dict[str, Any] = json.loads(done.stdout)
        for path in bundle.get("files") or {}:
            assert Path(path).is_relative_to((root / "files").resolve()), path
        home = root / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {**bundle["env"], "PATH": os.environ.get("PATH", os.defpath), "HOME": str(home), "LANG": "C.UTF-8"}
        return bundle, Sandbox(env, home, {p: Path(p) for p in bundle.get("files") or {}})

    def revoke(self, run_id: str) -> None:
        response = httpx.post(f"{self.broker_url}/v1/revocations", json={"scope": "run", "name": run_id},
                              headers={"X-Vault-Token": self.vault.admin_token}, timeout=10)
        assert response.status_code < 300, response.text

    def connections(self) -> dict[str, int]:
        """TCP connections each upstream has accepted so far."""
        return {name: server.connections for name, server in self.upstreams.items()}

    def audit(self, match: Callable[[dict[str, Any]], bool], count: int = 1,
              timeout: float = 10.0) -> list[dict[str, Any]]:
        """The audit lines (any kind; the entry's ``kind`` added as ``_kind``) that ``match``,
        oldest first, once at least ``count`` have arrived (or ``timeout`` passed)."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        deadline = time.monotonic() + timeout
        try:
            while True:
                found = []
                for _, fields in client.xrevrange(AUDIT_STREAM, count=AUDIT_SCAN):
                    line = {**json.loads(fields.get("line", "{}")), "_kind": fields.get("kind", "")}
                    if match(line):
                        found.append(line)
                if len(found) >= count or time.monotonic() > deadline:
                    return found[::-1]
                time.sleep(0.05)
        finally:
            client.close()

    def run_audit(self, run_id: str, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        return self.audit(lambda line: line.get("run") == run_id, count, timeout)

    def named_audit(self, run_id: str, name: str, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The run's audit lines about upstream or destination ``name``, once ``count`` of them
        have arrived (not ``count`` lines of the run: its other lines may come first)."""
        return self.audit(lambda line: line.get("run") == run_id and name in (line.get("destination"),
                                                                             line.get("upstream")), count, timeout)

    def request_line(self, request_id: str | None) -> dict[str, Any]:
        """The one request audit line (kind ``request``) of ``request_id``."""
        lines = self.audit(lambda x: x["_kind"] == "request" and x.get("request_id") == request_id)
        assert len(lines) == 1, f"{len(lines)} audit lines for request {request_id}"
        return lines[0]


@dataclass
class Page(Recording):
    """A page naming the host that served it (the documentation hosts under a wildcard)."""

    host: str = ""

    def route(self, path: str) -> tuple[int, str, bytes]:
        return 200, "text/plain", f"documentation from {self.host}{path}\n".encode()


def _resolve_map(servers: Mapping[str, TlsServer]) -> str:
    pairs = [f"{server.hostname}:{server.public_port}={server.address}" for server in servers.values()]
    return ",".join([*pairs, f"{METADATA_HOST}:443={METADATA_ADDRESS}"])


def _proxy_token(vault: DevVault) -> str:
    with open_client(vault.addr, vault.root_token) as client:
        answer = client.auth.token.create(policies=[PROXY_POLICY], ttl="24h")
    return str(answer["auth"]["client_token"])


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + PROXY_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"`valetkey proxy serve` exited {proc.returncode}:\n"
                               f"{log.read_text(errors='replace')[-4000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"`valetkey proxy serve` not listening on {port} after {PROXY_START_TIMEOUT}s:\n"
                       f"{log.read_text(errors='replace')[-4000:]}")


@contextmanager
def start_proxy(env: Mapping[str, str], port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``valetkey proxy serve`` as a real process (its output in ``log``), stopped on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from valetkey.cli import main; main()", "proxy", "serve"],
            env=dict(env), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        try:
            _wait_listening(proc, port, log)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def proxy_stack(redis_url: str, workdir: Path) -> Iterator[ProxyStack]:
    policy_dir = workdir / "policies"
    write_proxy_policies(policy_dir)
    policies = load_policy_dir(policy_dir)
    ca = TestCA.create(workdir / "ca")
    wheel = build_wheel(workdir / "wheel")
    with ExitStack() as stack:
        bao = stack.enter_context(OpenBaoDev())
        vault = DevVault.create(bao.addr, bao.root_token, policies)  # bootstrap: the CA, the proxy's policy
        apps: dict[str, Any] = {name: build_app(name, vault.secrets[name], workdir / "demo") for name in UPSTREAM_HOSTS}
        apps["pypi"], apps["pythonhosted"] = SimpleIndex(wheel=wheel), FileHost(wheel=wheel)
        apps["npm"] = NpmRegistry()
        apps.update({name: Page(host=host) for name, host in DOCS_HOSTS.items()})
        hosts = {**UPSTREAM_HOSTS, **DOCS_HOSTS, "pypi": INDEX_HOST, "pythonhosted": FILES_HOST, "npm": NPM_HOST}
        servers = {name: stack.enter_context(TlsServer(hosts[name], app, ca)) for name, app in apps.items()}
        # a plain-http mirror of the index: absolute-form requests through the proxy
        servers["mirror"] = stack.enter_context(TlsServer(MIRROR_HOST, SimpleIndex(wheel=wheel), None))
        broker_port, proxy_port = free_port(), free_port()
        broker_url, proxy_url = f"http://127.0.0.1:{broker_port}", f"http://127.0.0.1:{proxy_port}"
        settings = BrokerSettings.from_env({
            "VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.broker_token, "VALETKEY_REDIS_URL": redis_url,
            "VALETKEY_POLICY_DIR": str(policy_dir), "VALETKEY_ISSUER": broker_url,
            "VALETKEY_PROXY_URL": proxy_url, "VALETKEY_EGRESS": "proxy",
            "VALETKEY_PROXY_TRUST_FILE": str(ca.path),  # tunnelled TLS verifies against the test CA
        })
        stack.enter_context(ThreadedServer(create_app(settings, policies), port=broker_port))
        proxy_env = {
            "PATH": os.environ.get("PATH", os.defpath), "HOME": str(workdir), "LANG": "C.UTF-8",
            "VALETKEY_PROXY_LISTEN": f"127.0.0.1:{proxy_port}", "VAULT_ADDR": vault.addr,
            "VAULT_TOKEN": _proxy_token(vault), "VALETKEY_REDIS_URL": redis_url,
            "VALETKEY_BROKER_URL": broker_url, "VALETKEY_ISSUER": broker_url,
            "VALETKEY_POLICY_DIR": str(policy_dir), "VALETKEY_UPSTREAM_CA_FILE": str(ca.path),
            "VALETKEY_PROXY_TEST_RESOLVE": _resolve_map(servers), "VALETKEY_READ_TIMEOUT": "20s",
        }
        log = workdir / "proxy.log"
        proc = stack.enter_context(start_proxy(proxy_env, proxy_port, log))
        yield ProxyStack(vault, broker_url, proxy_url, redis_url, ca, servers, proc, log, workdir / "demo" / "git",
                         proxy_env)
