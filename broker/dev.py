"""``valetkey dev``: the local stack in one command — OpenBao dev server, Redis, Vault bootstrap,
the broker, and a demo run. Every child is stopped on Ctrl-C or when any one of them dies.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import click
import httpx

from broker.devstack import DevVault
from broker.errors import ServiceError, ValetkeyError
from broker.localstack import LOOPBACK, LocalService, OpenBaoDev, RedisServer
from policies.load import PolicyLoadError, load_policy_dir
from policies.model import PolicySet

Echo = Callable[[str], None]
READY_TIMEOUT = 15.0


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def check_ports(ports: dict[str, int]) -> None:
    taken = [f"{name} port {port}" for name, port in ports.items() if port and not port_free(port)]
    if taken:
        raise ServiceError(f"already in use: {', '.join(taken)}; pick others with the --*-port options")


@dataclass
class Child:
    """A valetkey child process (broker, gateway, demo upstream) with a readiness URL."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(self.ready_url, timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise ServiceError(f"{self.name} not ready within {READY_TIMEOUT:.0f}s: {self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-1500:]
        except OSError:
            return ""


def valetkey_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "broker.cli", *args]


@dataclass
class DevStack:
    policies: PolicySet
    policy_dir: Path
    workdir: Path
    vault_port: int
    redis_port: int
    broker_port: int
    echo: Echo

    def run(self, *, demo: bool, until_stopped: bool = True) -> None:
        check_ports({"vault": self.vault_port, "redis": self.redis_port, "broker": self.broker_port})
        with ExitStack() as stack:
            vault = OpenBaoDev(port=self.vault_port)
            redis = RedisServer(port=self.redis_port)
            self._service(stack, vault, "OpenBao dev server")
            self._service(stack, redis, "Redis")
            self.echo("• bootstrapping Vault (transit key, ACL policies, AppRoles, demo secrets)…")
            dev_vault = DevVault.create(vault.addr, vault.root_token, self.policies)
            broker_url = f"http://{LOOPBACK}:{self.broker_port}"
            broker = Child(
                "broker", valetkey_argv("broker", "serve"), self._broker_env(dev_vault, redis.url),
                f"{broker_url}/readyz", self.workdir / "broker.log",
            )
            self.echo(f"• broker on {broker_url} …")
            stack.callback(broker.stop)
            broker.start()
            self.echo(f"  ready (log {broker.log})")
            self._summary(dev_vault, redis.url, broker_url)
            if demo:
                self._demo(dev_vault, broker_url)
            if until_stopped:
                self._wait([broker], [vault, redis])

    def _service(self, stack: ExitStack, service: LocalService, label: str) -> None:
        self.echo(f"• {label} on {LOOPBACK}:{service.port} …")
        stack.enter_context(service)
        self.echo("  ready")

    def _broker_env(self, vault: DevVault, redis_url: str) -> dict[str, str]:
        return {
            **os.environ, "VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.broker_token,
            "VALETKEY_REDIS_URL": redis_url, "VALETKEY_POLICY_DIR": str(self.policy_dir),
            "VALETKEY_LISTEN": f"{LOOPBACK}:{self.broker_port}",
            "VALETKEY_ISSUER": f"http://{LOOPBACK}:{self.broker_port}",
        }

    def _summary(self, vault: DevVault, redis_url: str, broker_url: str) -> None:
        self.echo("")
        self.echo("valetkey dev stack is up (development only: in-memory Vault, demo secrets)")
        self.echo(f"  export VAULT_ADDR={vault.addr}")
        self.echo(f"  export VAULT_TOKEN={vault.root_token}    # dev root token")
        self.echo(f"  export VALETKEY_BROKER_URL={broker_url}")
        self.echo(f"  redis: {redis_url}")

    def _demo(self, vault: DevVault, broker_url: str) -> None:
        runtime = next((r for r in self.policies.runtimes.values() if r.identity.vault_policy
                        or r.identity.approle_role), None)
        if runtime is None:
            self.echo("  (no runtime in policy: no demo run)")
            return
        token = vault.runtime_token(runtime.name)
        grants = [
            {"upstream": up, "purpose": sorted(purposes)[0],
             "params": {p: "demo" for p in self.policies.upstreams[up].purposes[sorted(purposes)[0]].params}}
            for up, purposes in sorted(runtime.allow.items())
        ]
        response = httpx.post(f"{broker_url}/v1/runs", json={"grants": grants},
                              headers={"X-Vault-Token": token}, timeout=10)
        response.raise_for_status()
        bundle = response.json()
        self.echo("")
        self.echo(f"demo run {bundle['run_id']} for runtime {runtime.name} (expires in "
                  f"{bundle['expires_in']}s); the sandbox's environment:")
        for line in bundle["dotenv"].splitlines():
            self.echo(f"  {line}")
        self.echo("")
        self.echo(f"  runtime token ({runtime.name}): VAULT_TOKEN={token}")
        self.echo("  mint another: valetkey run create --grant UPSTREAM:PURPOSE[:k=v] --format env")

    def _wait(self, children: list[Child], services: list[LocalService]) -> None:
        self.echo("\nCtrl-C to stop.")
        stop = {"now": False}

        def on_signal(signum: int, frame: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, on_signal)
        try:
            while not stop["now"]:
                dead = [c.name for c in children if not c.alive()]
                dead += [s.name for s in services if not s.running]
                if dead:
                    self.echo(f"stopping: {', '.join(dead)} exited")
                    return
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        self.echo("stopping…")


@click.command("dev")
@click.option("--policy-dir", type=click.Path(path_type=Path), default=None,
              help="your own policies [default: the shipped policies]")
@click.option("--vault-port", type=int, default=8200, show_default=True)
@click.option("--redis-port", type=int, default=6379, show_default=True)
@click.option("--broker-port", type=int, default=8400, show_default=True)
@click.option("--no-demo", is_flag=True, help="do not mint a demo run")
def dev_command(policy_dir: Path | None, vault_port: int, redis_port: int, broker_port: int,
                no_demo: bool) -> None:
    """Run the local stack: OpenBao, Redis, Vault bootstrap, broker, and a demo run."""
    from broker.settings import SHIPPED_POLICY_DIR

    directory = policy_dir or SHIPPED_POLICY_DIR
    try:
        policies = load_policy_dir(directory)
    except PolicyLoadError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    workdir = Path(os.environ.get("VALETKEY_DEV_DIR", ".valetkey-dev")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    stack = DevStack(policies, directory.resolve(), workdir, vault_port, redis_port, broker_port,
                     lambda line: click.echo(line))
    try:
        stack.run(demo=not no_demo)
    except ValetkeyError as exc:
        click.echo(f"error: {exc.detail}", err=True)
        sys.exit(1)
