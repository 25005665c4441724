"""``valetkey dev``: the whole local stack in one command.

OpenBao dev server, Redis, the Vault bootstrap, demo upstreams that behave like the real APIs
and accept only their real secret (OpenAI-like with streaming, Anthropic-like, GitHub-like with a
header-echo debug endpoint, git smart-HTTP), the broker, one gateway per upstream, and a demo run
with three copy-paste commands. Everything stops on Ctrl-C or when any one part dies.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import httpx

from contract.errors import ServiceError, ValetkeyError
from policies.load import PolicyLoadError, load_policy_dir
from policies.model import PolicySet
from valetkey.dev.demo.policies import DEMO_RUNTIME, DEMO_UPSTREAMS, demo_grants, write_demo_policies
from valetkey.dev.processes import Child, check_ports, valetkey_argv
from valetkey.dev.services import LOOPBACK, LocalService, OpenBaoDev, RedisServer, free_port
from valetkey.dev.state import (
    ADMIN_TOKEN_FILE,
    DEFAULT_DIR,
    ROOT_TOKEN_FILE,
    DevState,
    DirLock,
    runtime_token_file,
    state_dir,
    write_secret_file,
)
from valetkey.dev.vault_seed import DevVault

DEV_SECRET_REFRESH = "2s"  # noqa: S105 - a duration; a secret written with `valetkey secret put` reaches the gateway quickly

ECHO = ('curl -s -H "Authorization: Bearer $GITHUB_TOKEN" '
        '"$GITHUB_API_URL/repos/acme/widgets/debug/headers"')
INJECT = 'curl -s -H "Authorization: Bearer $GITHUB_TOKEN" "$GITHUB_API_URL/repos/acme/widgets"'
PASSTHROUGH = ('curl -s -H "Authorization: Bearer ghp_0123456789abcdefghijABCDEFGHIJ012345" '
               '"$GITHUB_API_URL/repos/acme/widgets"')


@dataclass
class DevStack:
    workdir: Path
    vault_port: int
    redis_port: int
    broker_port: int
    gateway_port: int  # first gateway port; the others follow
    upstreams: tuple[str, ...]
    policy_dir: Path | None  # None: the demo upstreams and their policies
    demo: bool
    echo: Any = click.echo
    children: list[Child] = field(default_factory=list)
    proxy_port: int = 8480  # the egress proxy; 0 (or --gateway-port 0) picks a free port

    def _ports(self, names: tuple[str, ...], offset: int) -> dict[str, int]:
        """Consecutive ports from --gateway-port (+ offset), or free ones when it is 0."""
        if self.gateway_port == 0:
            return {name: free_port() for name in names}
        return {name: self.gateway_port + offset + i for i, name in enumerate(names)}

    def run(self, *, until_stopped: bool = True) -> None:
        started = time.monotonic()
        with ExitStack() as stack:
            stack.enter_context(DirLock(self.workdir))
            stack.callback(self._stop_children)
            policies, policy_dir, demo_ports = self._policies()
            names = self.upstreams or tuple(policies.upstreams)
            unknown = sorted(set(names) - set(policies.upstreams))
            if unknown:
                known = sorted(policies.upstreams)
                raise ServiceError(f"no upstream {unknown} in {policy_dir}; known: {known}")
            gateways = self._ports(names, 0)
            if self.proxy_port == 0 or self.gateway_port == 0:
                self.proxy_port = free_port()
            check_ports({"vault": self.vault_port, "redis": self.redis_port, "broker": self.broker_port,
                         "proxy": self.proxy_port,
                         **{f"gateway {n}": p for n, p in gateways.items()},
                         **{f"demo upstream {n}": p for n, p in demo_ports.items()}})
            vault, redis = OpenBaoDev(port=self.vault_port), RedisServer(port=self.redis_port)
            for service, label in ((vault, "OpenBao dev server"), (redis, "Redis")):
                self._service(stack, service, label)
            kind = "demo secrets" if demo_ports else "placeholder secrets"
            self.echo(f"• Vault bootstrap: transit key, ACL policies, AppRoles, {kind} …")
            dev_vault = DevVault.create(vault.addr, vault.root_token, policies,
                                        seed_kind="real" if demo_ports else "placeholder")
            self.echo("  done")
            if demo_ports:
                self._demo_upstreams(stack, dev_vault, demo_ports)
            broker_url = self._broker(dev_vault, redis.url, policy_dir, gateways)
            self._gateways(dev_vault, redis.url, policy_dir, broker_url, gateways)
            self._proxy(dev_vault, redis.url, policy_dir, broker_url)
            DevState(os.getpid(), broker_url, redis.url, vault.addr, str(policy_dir.resolve()),
                     {n: f"http://{LOOPBACK}:{p}" for n, p in gateways.items()}).write(self.workdir)
            self._summary(dev_vault, broker_url, redis.url, gateways, time.monotonic() - started)
            self._tokens(dev_vault, policies)
            if not demo_ports:
                self._placeholders(tuple(gateways))
            if self.demo:
                self._demo_run(dev_vault, broker_url, policies, names)
            if until_stopped:
                self._wait([vault, redis])

    def _policies(self) -> tuple[PolicySet, Path, dict[str, int]]:
        if self.policy_dir is not None:
            return load_policy_dir(self.policy_dir), self.policy_dir, {}
        names = self.upstreams or DEMO_UPSTREAMS
        unknown = sorted(set(names) - set(DEMO_UPSTREAMS))
        if unknown:
            raise ServiceError(f"no demo upstream {unknown}; known: {list(DEMO_UPSTREAMS)}")
        ports = self._ports(names, 100)
        directory = self.workdir / "policies"
        for old in directory.glob("*.yaml"):
            old.unlink()
        write_demo_policies(directory, ports)
        return load_policy_dir(directory), directory, ports

    def _service(self, stack: ExitStack, service: LocalService, label: str) -> None:
        self.echo(f"• {label} on {LOOPBACK}:{service.port} …")
        stack.enter_context(service)
        self.echo("  ready")

    def _demo_upstreams(self, stack: ExitStack, vault: DevVault, ports: dict[str, int]) -> None:
        from valetkey.dev.demo.servers import start_demo_upstreams

        self.echo(f"• demo upstreams: {', '.join(f'{n} on :{p}' for n, p in ports.items())} …")
        demo = start_demo_upstreams(vault.secrets, self.workdir / "demo", ports)
        stack.callback(demo.stop)
        self.echo("  ready (each accepts only its real secret)")

    def _start(self, child: Child) -> None:
        self.echo(f"• {child.name} on {urlsplit(child.ready_url).netloc} …")
        self.children.append(child)
        child.start()
        self.echo(f"  ready (log {child.log})")

    def _common_env(self, vault: DevVault, redis_url: str, policy_dir: Path) -> dict[str, str]:
        return {**os.environ, "VAULT_ADDR": vault.addr, "VALETKEY_REDIS_URL": redis_url,
                "VALETKEY_POLICY_DIR": str(policy_dir), "VALETKEY_ISSUER": f"http://{LOOPBACK}:{self.broker_port}"}

    def _broker(self, vault: DevVault, redis_url: str, policy_dir: Path, gateways: dict[str, int]) -> str:
        url = f"http://{LOOPBACK}:{self.broker_port}"
        env = {**self._common_env(vault, redis_url, policy_dir), "VAULT_TOKEN": vault.broker_token,
               "VALETKEY_LISTEN": f"{LOOPBACK}:{self.broker_port}",
               "VALETKEY_GATEWAY_URLS": ",".join(f"{n}=http://{LOOPBACK}:{p}" for n, p in gateways.items()),
               # bundles name the gateways (base URLs) and the egress proxy (everything else)
               "VALETKEY_PROXY_URL": f"http://{LOOPBACK}:{self.proxy_port}", "VALETKEY_EGRESS": "both"}
        self._start(Child("broker", valetkey_argv("broker", "serve"), env, f"{url}/readyz",
                          self.workdir / "broker.log"))
        return url

    def _gateways(self, vault: DevVault, redis_url: str, policy_dir: Path, broker_url: str,
                  ports: dict[str, int]) -> None:
        """Start every gateway at once, then wait for each: start-up time is the slowest one's."""
        children = []
        for name, port in ports.items():
            env = {**self._common_env(vault, redis_url, policy_dir),
                   "VAULT_TOKEN": vault.gateway_token(name),
                   "VALETKEY_BROKER_URL": broker_url, "VALETKEY_LISTEN": f"{LOOPBACK}:{port}",
                   "VALETKEY_SECRET_REFRESH": os.environ.get("VALETKEY_SECRET_REFRESH", DEV_SECRET_REFRESH)}
            child = Child(f"gateway {name}", valetkey_argv("gateway", "serve", "--upstream", name), env,
                          f"http://{LOOPBACK}:{port}/.valetkey/readyz", self.workdir / f"gateway-{name}.log")
            self.children.append(child)
            child.spawn()
            children.append(child)
        self.echo(f"• gateways: {', '.join(f'{n} on :{p}' for n, p in ports.items())} …")
        for child in children:
            child.wait_ready()
        self.echo(f"  ready (logs {self.workdir}/gateway-*.log)")

    def _proxy(self, vault: DevVault, redis_url: str, policy_dir: Path, broker_url: str) -> None:
        env = {**self._common_env(vault, redis_url, policy_dir), "VAULT_TOKEN": vault.proxy_token(),
               "VALETKEY_BROKER_URL": broker_url, "VALETKEY_PROXY_LISTEN": f"{LOOPBACK}:{self.proxy_port}",
               "VALETKEY_SECRET_REFRESH": os.environ.get("VALETKEY_SECRET_REFRESH", DEV_SECRET_REFRESH)}
        self._start(Child("egress proxy", valetkey_argv("proxy", "serve"), env,
                          f"http://{LOOPBACK}:{self.proxy_port}/.valetkey/readyz",
                          self.workdir / "proxy.log"))

    def _summary(self, vault: DevVault, broker_url: str, redis_url: str, gateways: dict[str, int],
                 took: float) -> None:
        self.echo("")
        secrets = "demo secrets" if self.policy_dir is None else "placeholder secrets"
        self.echo(f"valetkey dev stack is up in {took:.1f}s "
                  f"(development only: in-memory Vault, {secrets})")
        self.echo(f"  broker    {broker_url}")
        for name, port in gateways.items():
            self.echo(f"  gateway   {name:<11} http://{LOOPBACK}:{port}")
        self.echo(f"  proxy     http://{LOOPBACK}:{self.proxy_port}  (HTTPS_PROXY of every run's bundle)")
        self.echo(f"  redis     {redis_url}")
        self.echo(f"  vault     {vault.addr}  (root token in {self.workdir / ROOT_TOKEN_FILE})")
        self.echo(f"  state     {self.workdir}  (logs, tokens, dev.json: where the CLI finds this stack)")
        write_secret_file(self.workdir / ROOT_TOKEN_FILE, vault.root_token)

    def _tokens(self, vault: DevVault, policies: PolicySet) -> None:
        """Ready-to-use tokens for each runtime and the security team, and how to use them."""
        written: dict[str, Path] = {}
        for name, runtime in policies.runtimes.items():
            if runtime.identity.vault_policy or runtime.identity.approle_role:
                written[name] = self.workdir / runtime_token_file(name)
                write_secret_file(written[name], vault.runtime_token(name))
        admin = self.workdir / ADMIN_TOKEN_FILE
        write_secret_file(admin, vault.admin_token)
        self.echo("")
        self.echo("Tokens (development only, files of mode 0600):")
        width = max([len(f"runtime {n}") for n in written] + [len("security team")])
        for name, path in written.items():
            self.echo(f"  {'runtime ' + name:<{width}}  {path}")
        self.echo(f"  {'security team':<{width}}  {admin}")
        if self.workdir != Path(DEFAULT_DIR).resolve():
            self.echo("The CLI finds this stack when told where it is: "
                      f"export VALETKEY_DEV_DIR={self.workdir}")
        else:
            self.echo("The CLI finds this stack by itself when run from this directory (no --broker needed):")
        first = next(iter(written), None)
        if first is not None:
            grant = self._example_grant(policies, first)
            self.echo(f"  VAULT_TOKEN=$(cat {written[first]}) valetkey run create --grant {grant} "
                      "--format env")
        self.echo(f"  VAULT_TOKEN=$(cat {admin}) valetkey revoke --run RUN_ID --reason WHY")
        self.echo(f"  VAULT_TOKEN=$(cat {admin}) valetkey run show RUN_ID")
        self.echo("  valetkey audit query --since 15m")

    @staticmethod
    def _example_grant(policies: PolicySet, runtime: str) -> str:
        for upstream, purposes in sorted(policies.runtimes[runtime].allow.items()):
            for purpose in sorted(purposes):
                params = policies.upstreams[upstream].purposes[purpose].params
                bound = ",".join(f"{p}=VALUE" for p in params)
                return f"{upstream}:{purpose}" + (f":{bound}" if bound else "")
        return "UPSTREAM:PURPOSE"

    def _placeholders(self, names: tuple[str, ...]) -> None:
        if not names:
            return
        self.echo("")
        self.echo("!" * 78)
        self.echo(f"!! PLACEHOLDER secrets in Vault for: {', '.join(names)}")
        self.echo("!! Your upstream will refuse them (401/403). Write each real secret once, then every")
        self.echo("!! request through the gateway carries it (gateways re-read it every "
                  f"{DEV_SECRET_REFRESH}):")
        for name in names:
            self.echo(f"!!   valetkey secret put {name}      # reads it from stdin or a hidden prompt")
        self.echo("!" * 78)

    def _demo_run(
        self, vault: DevVault, broker_url: str, policies: PolicySet, names: tuple[str, ...]
    ) -> None:
        runtime = policies.runtimes.get(DEMO_RUNTIME) or next(iter(policies.runtimes.values()), None)
        if runtime is None:
            self.echo("  (no runtime in policy: no demo run)")
            return
        if runtime.name == DEMO_RUNTIME:
            grants = demo_grants(tuple(n for n in DEMO_UPSTREAMS if n in names))
        else:
            grants = [{"upstream": up, "purpose": p,
                       "params": {k: "demo" for k in policies.upstreams[up].purposes[p].params}}
                      for up, purposes in sorted(runtime.allow.items()) if up in names
                      for p in sorted(purposes)]
        response = httpx.post(f"{broker_url}/v1/runs", json={"grants": grants[:runtime.max_grants]},
                              headers={"X-Vault-Token": vault.runtime_token(runtime.name)}, timeout=10)
        if response.status_code != 201:
            raise ServiceError(f"minting the demo run failed: {response.text[:300]}")
        bundle = response.json()
        env_file = self.workdir / "run.env"
        env_file.write_text(bundle["dotenv"])
        env_file.chmod(0o600)
        self.echo("")
        self.echo(f"demo run {bundle['run_id']} for runtime {runtime.name} "
                  f"(expires in {bundle['expires_in']}s).")
        self.echo("The sandbox's whole environment (placeholders, never secrets):")
        for line in bundle["dotenv"].splitlines():
            key, _, value = line.partition("=")
            self.echo(f"  {key}={value[:48] + '…' if len(value) > 60 else value}")
        self.echo(f"  (full file: {env_file})")
        if "github" in names and runtime.name == DEMO_RUNTIME:
            self.echo("")
            self.echo("Try it, in another shell:")
            self.echo(f"  set -a; . {env_file}; set +a")
            self.echo(f"  {INJECT}            # injection: the upstream saw its real secret")
            self.echo(f"  {ECHO}   # an echo of the secret comes back [REDACTED:valetkey]")
            self.echo(f"  {PASSTHROUGH}   # a real-looking token: 403 credential_passthrough")

    def _wait(self, services: list[LocalService]) -> None:
        self.echo("\nCtrl-C to stop.")
        stop = {"now": False}

        def on_signal(signum: int, frame: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (e.g. `cmd &`)
        try:
            while not stop["now"]:
                dead = [c.name for c in self.children if not c.alive()]
                dead += [s.name for s in services if not s.running]
                if dead:
                    self.echo(f"stopping: {', '.join(dead)} exited (see logs in {self.workdir})")
                    return
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        self.echo("stopping…")

    def _stop_children(self) -> None:
        for child in reversed(self.children):
            child.stop()


@click.command("dev")
@click.option("--upstreams", default="", help="Comma-separated upstreams [default: all].")
@click.option("--policy-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Your own policies instead of the demo upstreams (their hosts must be reachable).")
@click.option("--state-dir", "state_dir_option", type=click.Path(path_type=Path, file_okay=False),
              default=None,
              help="Logs, tokens and dev.json of this stack; one stack per directory "
                   f"[default: $VALETKEY_DEV_DIR, else ./{DEFAULT_DIR}].")
@click.option("--vault-port", type=int, default=8200, show_default=True, help="OpenBao dev server port.")
@click.option("--redis-port", type=int, default=6379, show_default=True, help="Redis port.")
@click.option("--broker-port", type=int, default=8400, show_default=True, help="Broker port.")
@click.option("--gateway-port", type=int, default=8410, show_default=True,
              help="First gateway port (demo upstreams from this + 100); 0 picks free ports.")
@click.option("--proxy-port", type=int, default=8480, show_default=True,
              help="Egress proxy port; 0 picks a free port.")
@click.option("--no-demo", is_flag=True, help="Do not mint a demo run.")
def dev_command(upstreams: str, policy_dir: Path | None, state_dir_option: Path | None, vault_port: int,
                redis_port: int, broker_port: int, gateway_port: int, proxy_port: int, no_demo: bool) -> None:
    """Run the local stack: OpenBao, Redis, bootstrap, demo upstreams, broker, gateways, a demo run."""
    workdir = state_dir(state_dir_option)
    names = tuple(n.strip() for n in upstreams.split(",") if n.strip())
    stack = DevStack(workdir, vault_port, redis_port, broker_port, gateway_port, names, policy_dir,
                     demo=not no_demo, proxy_port=proxy_port)
    try:
        stack.run()
    except (ValetkeyError, PolicyLoadError) as exc:
        click.echo(f"error: {getattr(exc, 'detail', exc)}", err=True)
        sys.exit(1)
