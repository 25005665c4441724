"""Postgres fixtures: a fresh PostgreSQL cluster (Debian's package), an OpenBao whose database
secrets engine manages it, a broker minting for a ``protocol: postgres`` upstream, and the Postgres
gateway in a thread of its own (its own event loop), on loopback ports."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import hvac
import pytest

from broker.app import create_app
from broker.settings import BrokerSettings
from gateways.pg_gateway import PgGateway
from gateways.settings import GatewaySettings
from policies.load import load_policy_dir
from policies.model import PolicySet
from tests.support.certs import make_ca, make_leaf
from tests.support.servers import ThreadedServer
from valetkey.dev import database
from valetkey.dev.postgres import PostgresServer
from valetkey.dev.services import OpenBaoDev, RedisServer, free_port
from valetkey.dev.vault_seed import DevVault

ISSUER = "http://broker.pg-tests.valetkey.test"
ENV = {"appdb": ("PGPASSWORD", "DATABASE_URL"), "budgeted": ("BUDGETED_PGPASSWORD", "BUDGETED_URL"),
       "tlsdb": ("TLSDB_PGPASSWORD", "TLSDB_URL")}
LEASE_TTL = 60  # the Vault roles' default_ttl in the tests: renewed by the gateway while held


RUNTIME = """version: 1
kind: runtime
name: pgtester
identity: {vault_policy: valetkey-runtime-pgtester}
max_ttl: 1h
allow:
  appdb: [read, write]
  budgeted: [read]
  tlsdb: [read]
"""


class LoopThread:
    """An asyncio loop in a daemon thread: the gateway runs there as it would in its process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@dataclass
class PgStack:
    postgres: PostgresServer
    vault: DevVault
    policies: PolicySet
    broker_url: str
    redis_url: str
    loop: LoopThread
    policy_dir: Path
    gateways: dict[str, PgGateway] = field(default_factory=dict)

    def mint(self, upstream: str, purpose: str, ttl: str = "10m") -> dict[str, Any]:
        return self.mint_grants([{"upstream": upstream, "purpose": purpose}], ttl)

    def mint_grants(self, grants: list[dict[str, str]], ttl: str = "10m") -> dict[str, Any]:
        response = httpx.post(f"{self.broker_url}/v1/runs", json={"grants": grants, "ttl": ttl},
                              headers={"X-Vault-Token": self.vault.runtime_token("pgtester")})
        response.raise_for_status()
        bundle: dict[str, Any] = response.json()
        return bundle

    def end(self, run_id: str) -> None:
        httpx.delete(f"{self.broker_url}/v1/runs/{run_id}",
                     headers={"X-Vault-Token": self.vault.admin_token}).raise_for_status()

    def revoke(self, run_id: str) -> None:
        httpx.post(f"{self.broker_url}/v1/revocations", json={"scope": "run", "name": run_id, "reason": "test"},
                   headers={"X-Vault-Token": self.vault.admin_token}).raise_for_status()

    def dsn(self, bundle: dict[str, Any], upstream: str = "appdb", **override: str) -> str:
        """libpq conninfo from the bundle (URL + PGPASSWORD), with overrides."""
        password_var, url_var = ENV[upstream]
        url = httpx.URL(bundle["env"][url_var])
        values = {"host": url.host, "port": str(url.port), "dbname": url.path.lstrip("/"),
                  "user": url.username, "password": bundle["env"][password_var], "sslmode": "disable",
                  "connect_timeout": "5", **override}
        return " ".join(f"{k}={v}" for k, v in values.items())

    def database_users(self) -> list[str]:
        out = self.postgres.sql("SELECT rolname FROM pg_roles WHERE rolname LIKE 'v-%' ORDER BY 1")
        return [line for line in out.splitlines() if line]

    def gateway_env(self, name: str, **extra: str) -> dict[str, str]:
        return {"VAULT_ADDR": self.vault.addr, "VAULT_TOKEN": self.vault.gateway_token(name),
               "VALETKEY_REDIS_URL": self.redis_url, "VALETKEY_BROKER_URL": self.broker_url,
               "VALETKEY_ISSUER": ISSUER, "VALETKEY_LISTEN": "127.0.0.1:0",
               "VALETKEY_POLICY_DIR": str(self.policy_dir), **extra}

    def start_gateway(self, name: str, register: bool = True, **extra: str) -> PgGateway:
        env = self.gateway_env(name, **extra)
        settings = GatewaySettings.from_env(name, env)

        async def start() -> PgGateway:
            gateway = PgGateway.build(settings, self.policies.upstreams[name], env=env, lease_tick=0.2)
            await gateway.start()
            return gateway

        gateway: PgGateway = self.loop.run(start())
        if register:
            self.gateways[name] = gateway
        return gateway


@pytest.fixture(scope="session")
def pg_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgStack]:
    policy_dir = tmp_path_factory.mktemp("pg-policies")
    certs = tmp_path_factory.mktemp("pg-certs")
    ca_file, ca_key, ca = make_ca(certs)
    # the database speaks TLS too: upstream "tlsdb" reaches it as localhost with tls: verify-full
    with PostgresServer(ssl_files=make_leaf(certs, ca_key, ca, "localhost")) as postgres, \
            OpenBaoDev() as bao, RedisServer() as redis_server:
        manager_password = database.prepare(postgres)
        # the gateway URL the broker hands out is filled in once the gateway listens
        gateway_ports = {"appdb": free_port(), "budgeted": free_port(), "tlsdb": free_port()}
        for name in gateway_ports:
            tls = {"host": "localhost", "tls": "verify-full"} if name == "tlsdb" else {}
            (policy_dir / f"{name}.yaml").write_text(database.upstream_policy(
                name, postgres.port, *ENV[name], requests=3 if name == "budgeted" else None, **tls))
        (policy_dir / "pgtester.yaml").write_text(RUNTIME)
        policies = load_policy_dir(policy_dir)
        dev = DevVault.create(bao.addr, bao.root_token, policies)
        database.configure(hvac.Client(url=bao.addr, token=bao.root_token), postgres, list(gateway_ports),
                           manager_password, ttl=LEASE_TTL)
        urls = ",".join(f"{n}=postgresql://127.0.0.1:{p}?sslmode=disable" for n, p in gateway_ports.items())
        settings = BrokerSettings.from_env({
            "VAULT_ADDR": dev.addr, "VAULT_TOKEN": dev.broker_token, "VALETKEY_REDIS_URL": redis_server.url,
            "VALETKEY_POLICY_DIR": str(Path(policy_dir)), "VALETKEY_ISSUER": ISSUER,
            "VALETKEY_GATEWAY_URLS": urls,
        })
        loop = LoopThread()
        with ThreadedServer(create_app(settings, policies)) as broker:
            stack = PgStack(postgres, dev, policies, broker.url, redis_server.url, loop, policy_dir)
            try:
                for name, port in gateway_ports.items():
                    stack.start_gateway(name, VALETKEY_LISTEN=f"127.0.0.1:{port}",
                                        VALETKEY_UPSTREAM_CA_FILE=str(ca_file))
                yield stack
            finally:
                for gateway in stack.gateways.values():
                    loop.run(gateway.stop())
                loop.close()
