"""``valetkey dev``: the whole local stack in one command.

OpenBao dev server, Redis, the Vault bootstrap, demo upstreams that behave like the real APIs
and accept only their real secret (OpenAI-like with streaming, Anthropic-like, GitHub-like with a
header-echo debug endpoint, git smart-HTTP), the broker, one gateway per upstream, and a demo run
with three copy-paste commands. Everything stops on Ctrl-C or when any one part dies.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import httpx
import hvac

from contract.errors import ServiceError
from policies.load import load_policy_dir
from policies.model import PolicySet
from valetkey.dev import database
from valetkey.dev.demo.policies import DEMO_RUNTIME, DEMO_UPSTREAMS, demo_grants, write_demo_policies
from valetkey.dev.postgres import PostgresServer
from valetkey.dev.processes import Child, check_ports, valetkey_argv
from valetkey.dev.services import LOOPBACK, LocalService, OpenBaoDev, RedisServer, free_port
from valetkey.dev.state import (
    ADMIN_TOKEN_FILE,
    DEFAULT_DIR,
    ROOT_TOKEN_FILE,
    DevState,
    DirLock,
    runtime_token_file,
    write_secret_file,
)
from valetkey.dev.vault_seed import DevVault

DEV_SECRET_REFRESH = "2s"  # noqa: S105 - a duration; a secret written with `valetkey secret put` reaches the gateway quickly

ECHO = ('curl -s -H "Authorization: Bearer $GITHUB_TOKEN" '
        '"$GITHUB_API_URL/repos/acme/widgets/debug/headers"')
INJECT = 'curl -s -H "Authorization: Bearer $GITHUB_TOKEN" "$GITHUB_API_URL/repos/acme/widgets"'
HELD = ('curl -s -H "Authorization: Bearer $GITHUB_TOKEN" -d \'{"tag_name": "v1.0"}\' '
        '"$GITHUB_API_URL/repos/acme/widgets/releases"')
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
    postgres: bool = False  # also a PostgreSQL with the demo database, Vault's engine, gateway appdb
    echo: Any = click.echo
    children: list[Child] = field(default_factory=list)
    proxy_port: int = 8480  # the egress proxy; 0 (or --gateway-port 0) picks a free port
    ha: bool = False  # a three-node OpenBao Raft cluster and Redis with Sentinel instead of one each
    ha_redis: str = "sentinel"  # with ha: "sentinel", or "cluster" (a Redis Cluster)
    _vault_addr: str = ""  # what the broker and gateways get as VAULT_ADDR (every node with --ha)

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
            manager_password, pg = "", None
            if self.postgres:
                pg, manager_password = self._postgres(stack, policy_dir)
                policies = load_policy_dir(policy_dir)
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
            watched: list[LocalService] = []
            if self.ha:
                vault_addr, root_token, redis_url = self._ha_services(stack)
            else:
                vault, redis = OpenBaoDev(port=self.vault_port), RedisServer(port=self.redis_port)
                for service, label in ((vault, "OpenBao dev server"), (redis, "Redis")):
                    self._service(stack, service, label)
                vault_addr, root_token, redis_url = vault.addr, vault.root_token, redis.url
                watched = [vault, redis]
            self._vault_addr = vault_addr
            kind = "demo secrets" if demo_ports else "placeholder secrets"
            self.echo(f"• Vault bootstrap: transit key, ACL policies, AppRoles, {kind} …")
            dev_vault = DevVault.create(vault_addr.split(",")[0], root_token, policies,
                                        seed_kind="real" if demo_ports else "placeholder")
            self.echo("  done")
            if pg is not None:
                database.configure(hvac.Client(url=dev_vault.addr, token=root_token), pg,
                                   [database.DEV_UPSTREAM], manager_password)
                self.echo(f"• Vault database engine at {database.MOUNT}/ for the demo database")
            if demo_ports:
                self._demo_upstreams(stack, dev_vault, demo_ports)
            broker_url = self._broker(dev_vault, redis_url, policy_dir, gateways, policies)
            self._gateways(dev_vault, redis_url, policy_dir, broker_url, gateways, policies)
            self._proxy(dev_vault, redis_url, policy_dir, broker_url)
            DevState(os.getpid(), broker_url, redis_url, dev_vault.addr, str(policy_dir.resolve()),
                     {n: self._gateway_url(policies, n, p) for n, p in gateways.items()}).write(self.workdir)
            self._summary(dev_vault, broker_url, redis_url, gateways, time.monotonic() - started)
            self._tokens(dev_vault, policies)
            self._console(dev_vault, broker_url)
            if not demo_ports:  # a Postgres upstream's credential comes from its lease, not KV
                self._placeholders(tuple(n for n in gateways if policies.upstreams[n].secret is not None))
            if self.demo:
                self._demo_run(dev_vault, broker_url, policies, names)
            if until_stopped:
                self._wait(watched)  # with --ha a node may die: that is what it is for

    def _policies(self) -> tuple[PolicySet, Path, dict[str, int]]:
        if self.policy_dir is not None:
            return load_policy_dir(self.policy_dir), self.policy_dir, {}
        names = tuple(n for n in self.upstreams if not (self.postgres and n == database.DEV_UPSTREAM))
        names = names or (() if self.upstreams else DEMO_UPSTREAMS)
        unknown = sorted(set(names) - set(DEMO_UPSTREAMS))
        if unknown:
            raise ServiceError(f"no demo upstream {unknown}; known: {list(DEMO_UPSTREAMS)}")
        ports = self._ports(names, 100)
        directory = self.workdir / "policies"
        for old in directory.glob("*.yaml"):
            old.unlink()
        write_demo_policies(directory, ports)
        return load_policy_dir(directory), directory, ports

    def _postgres(self, stack: ExitStack, policy_dir: Path) -> tuple[PostgresServer, str]:
        if self.policy_dir is not None:
            raise ServiceError("--postgres adds the demo database to the demo policies; with --policy-dir, "
                               "configure your own database (docs/operations.md, Postgres upstreams)")
        pg = PostgresServer()
        self._service(stack, pg, "PostgreSQL (demo database app, table items)")
        password = database.prepare(pg)
        database.write_dev_policies(policy_dir, pg.port)
        return pg, password

    @staticmethod
    def _gateway_url(policies: PolicySet, name: str, port: int) -> str:
        if policies.upstreams[name].protocol == "postgres":  # loopback: no TLS needed (docs/policy.md)
            return f"postgresql://{LOOPBACK}:{port}?sslmode=disable"
        return f"http://{LOOPBACK}:{port}"

    def _ha_services(self, stack: ExitStack) -> tuple[str, str, str]:
        """(VAULT_ADDR listing every node, root token, redis+sentinel:// or redis+cluster:// URL),
        on free ports."""
        from valetkey.dev.cluster import ClusterTopology
        from valetkey.dev.raft import RaftCluster
        from valetkey.dev.sentinel import SentinelTopology

        self.echo("• OpenBao Raft cluster (three nodes, initialised and unsealed here) …")
        cluster = stack.enter_context(RaftCluster())
        self.echo(f"  ready: {cluster.addr}")
        topology: SentinelTopology | ClusterTopology
        if self.ha_redis == "cluster":
            self.echo("• Redis Cluster: three masters, a replica each …")
            topology = stack.enter_context(ClusterTopology())
        else:
            self.echo("• Redis primary, replica and three sentinels …")
            topology = stack.enter_context(SentinelTopology())
        self.echo(f"  ready: {topology.url}")
        return cluster.addr, cluster.root_token, topology.url

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
        return {**os.environ, "VAULT_ADDR": self._vault_addr or vault.addr, "VALETKEY_REDIS_URL": redis_url,
                "VALETKEY_POLICY_DIR": str(policy_dir), "VALETKEY_ISSUER": f"http://{LOOPBACK}:{self.broker_port}"}

    def _broker(self, vault: DevVault, redis_url: str, policy_dir: Path, gateways: dict[str, int],
                policies: PolicySet) -> str:
        url = f"http://{LOOPBACK}:{self.broker_port}"
        env = {**self._common_env(vault, redis_url, policy_dir), "VAULT_TOKEN": vault.broker_token,
               "VALETKEY_LISTEN": f"{LOOPBACK}:{self.broker_port}",
               "VALETKEY_CONSOLE_INSECURE_COOKIES": "1",  # plain HTTP on loopback: no Secure cookies
               "VALETKEY_GATEWAY_URLS": ",".join(f"{n}={self._gateway_url(policies, n, p)}"
                                                 for n, p in gateways.items()),
               # bundles name the gateways (base URLs) and the egress proxy (everything else)
               "VALETKEY_PROXY_URL": f"http://{LOOPBACK}:{self.proxy_port}", "VALETKEY_EGRESS": "both"}
        self._start(Child("broker", valetkey_argv("broker", "serve"), env, f"{url}/readyz",
                          self.workdir / "broker.log"))
        return url

    def _gateways(self, vault: DevVault, redis_url: str, policy_dir: Path, broker_url: str,
                  ports: dict[str, int], policies: PolicySet) -> None:
        """Start every gateway at once, then wait for each: start-up time is the slowest one's."""
        children = []
        for name, port in ports.items():
            env = {**self._common_env(vault, redis_url, policy_dir),
                   "VAULT_TOKEN": vault.gateway_token(name),
                   "VALETKEY_BROKER_URL": broker_url, "VALETKEY_LISTEN": f"{LOOPBACK}:{port}",
                   "VALETKEY_CONSOLE_URL": broker_url,
                   "VALETKEY_SECRET_REFRESH": os.environ.get("VALETKEY_SECRET_REFRESH", DEV_SECRET_REFRESH)}
            ready = (f"tcp://{LOOPBACK}:{port}" if policies.upstreams[name].protocol == "postgres"
                     else f"http://{LOOPBACK}:{port}/.valetkey/readyz")
            child = Child(f"gateway {name}", valetkey_argv("gateway", "serve", "--upstream", name), env,
                          ready, self.workdir / f"gateway-{name}.log")
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
            self.echo(f"  gateway   {name:<11} http://{LOOPBACK}:{port}" if name != database.DEV_UPSTREAM
                      or not self.postgres else
                      f"  gateway   {name:<11} postgresql://{LOOPBACK}:{port}  (runtime db-agent: "
                      f"run create --grant {name}:read, then psql \"$DATABASE_URL\")")
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

    def _console(self, vault: DevVault, broker_url: str) -> None:
        """The security console's address and a one-time sign-in link for the demo admin."""
        answer = httpx.post(f"{broker_url}/v1/console/sign-in-codes",
                            headers={"X-Vault-Token": vault.admin_token}, timeout=10.0)
        self.echo("")
        self.echo(f"Security console: {broker_url}/console")
        if answer.status_code == 200:
            self.echo(f"  sign in once as the security team (link good for 5 minutes, one use): "
                      f"{broker_url}{answer.json()['path']}")
        self.echo(f"  or paste the token in {self.workdir / ADMIN_TOKEN_FILE} at {broker_url}/console/login")
        self.echo(f"  requests waiting for a person: VAULT_TOKEN=$(cat {self.workdir / ADMIN_TOKEN_FILE}) "
                  "valetkey approvals list")

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
            self.echo(f"  {HELD}   # irreversible: waits until you approve it in the console")

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
