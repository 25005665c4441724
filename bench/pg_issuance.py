"""What a per-run database lease costs: ``python -m bench.pg_issuance [--runs N]``.

Starts PostgreSQL (Debian's package), OpenBao with the database engine, Redis, the broker and one
Postgres gateway (``valetkey gateway serve``), all on loopback, then measures for N runs:

* the lease alone: Vault ``database/creds/<role>`` (CREATE ROLE + GRANT in PostgreSQL) and its
  revocation (terminate + DROP ROLE), straight against Vault;
* a run's first session (connect + SELECT through the gateway: token check, lease, SCRAM login
  as the new user) right after the broker created the run (the gateway's prewarm is issuing the
  lease: the session waits for that same issuance), and once the prewarmed lease exists (its
  database user appears), against the run's second session (the lease is held) and a query on an
  open session.

Prints one Markdown table (milliseconds: median, p90, max) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import hvac
import psycopg

from bench.stack import ISSUER, wait_http
from policies.load import load_policy_dir
from valetkey.dev import database
from valetkey.dev.postgres import PostgresServer
from valetkey.dev.services import OpenBaoDev, RedisServer, free_port
from valetkey.dev.vault_seed import DevVault

UPSTREAM = "benchdb"
RUNTIME = """version: 1
kind: runtime
name: bench-db-agent
identity: {vault_policy: valetkey-runtime-bench-db-agent}
max_ttl: 1h
allow:
  benchdb: [read, write]
"""


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"{statistics.median(ordered) * 1000:.1f} | {p90 * 1000:.1f} | {ordered[-1] * 1000:.1f}"


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _select(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT count(*) FROM items").fetchone()


def _users(postgres: PostgresServer) -> int:
    return int(postgres.sql("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'v-%'").strip())


def _wait_for_user(postgres: PostgresServer, before: int, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while _users(postgres) <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("the gateway did not issue the run's lease at run creation")
        time.sleep(0.005)


def _wait_port(port: int, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def _spawn(workdir: Path, name: str, argv: list[str], env: dict[str, str],
           procs: list[subprocess.Popen[bytes]]) -> None:
    with (workdir / f"{name}.log").open("wb") as log:
        procs.append(subprocess.Popen(argv, env={**os.environ, **env}, stdout=log,  # noqa: S603
                                      stderr=subprocess.STDOUT))


def measure(runs: int) -> list[tuple[str, str]]:
    workdir = Path(tempfile.mkdtemp(prefix="valetkey-bench-pg-"))
    procs: list[subprocess.Popen[bytes]] = []
    with PostgresServer() as postgres, OpenBaoDev() as bao, RedisServer() as redis:
        manager_password = database.prepare(postgres)
        (workdir / f"{UPSTREAM}.yaml").write_text(database.upstream_policy(UPSTREAM, postgres.port))
        (workdir / "runtime.yaml").write_text(RUNTIME)
        vault = DevVault.create(bao.addr, bao.root_token, load_policy_dir(workdir))
        root = hvac.Client(url=bao.addr, token=bao.root_token)
        database.configure(root, postgres, [UPSTREAM], manager_password)
        broker_port, gateway_port = free_port(), free_port()
        broker_url = f"http://127.0.0.1:{broker_port}"
        common = {"VAULT_ADDR": bao.addr, "VALETKEY_REDIS_URL": redis.url, "VALETKEY_ISSUER": ISSUER,
                  "VALETKEY_POLICY_DIR": str(workdir)}
        try:
            _spawn(workdir, "broker", [sys.executable, "-m", "valetkey.cli", "broker", "serve",
                                       "--log-level", "warning"],
                   {**common, "VAULT_TOKEN": vault.broker_token,
                    "VALETKEY_LISTEN": f"127.0.0.1:{broker_port}",
                    "VALETKEY_GATEWAY_URLS": f"{UPSTREAM}=postgresql://127.0.0.1:{gateway_port}"
                                             "?sslmode=disable"},
                   procs)
            wait_http(f"{broker_url}/readyz", proc=procs[-1])
            _spawn(workdir, "gateway", [sys.executable, "-m", "valetkey.cli", "gateway", "serve",
                                        "--upstream", UPSTREAM, "--log-level", "warning"],
                   {**common, "VAULT_TOKEN": vault.gateway_token(UPSTREAM),
                    "VALETKEY_BROKER_URL": broker_url, "VALETKEY_LISTEN": f"127.0.0.1:{gateway_port}"},
                   procs)
            _wait_port(gateway_port)
            issue: list[float] = []
            revoke: list[float] = []
            for _ in range(runs):
                started = time.perf_counter()
                lease_id = root.read(f"database/creds/{database.role(UPSTREAM, 'ro')}")["lease_id"]
                issue.append(time.perf_counter() - started)
                started = time.perf_counter()
                root.sys.revoke_lease(lease_id)
                revoke.append(time.perf_counter() - started)
            direct = [_timed(lambda: _select(postgres.dsn(database.DATABASE))) for _ in range(runs)]
            first: list[float] = []
            warmed: list[float] = []
            second: list[float] = []
            query: list[float] = []
            for run in range(2 * runs):
                users = _users(postgres)
                grants = [{"upstream": UPSTREAM, "purpose": "read"}]
                response = httpx.post(f"{broker_url}/v1/runs", json={"grants": grants, "ttl": "10m"},
                                      headers={"X-Vault-Token": vault.runtime_token("bench-db-agent")})
                response.raise_for_status()
                env = response.json()["env"]
                url, password = env["DATABASE_URL"], env["PGPASSWORD"]

                def session(url: str = url, password: str = password) -> None:
                    with psycopg.connect(url, password=password) as conn:
                        conn.execute("SELECT count(*) FROM items").fetchone()

                if run % 2:  # every other run: wait until the prewarmed lease's user exists
                    _wait_for_user(postgres, users)
                    warmed.append(_timed(session))
                    continue
                first.append(_timed(session))
                second.append(_timed(session))
                with psycopg.connect(url, password=password) as conn:
                    started = time.perf_counter()
                    conn.execute("SELECT count(*) FROM items").fetchone()
                    query.append(time.perf_counter() - started)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=10)
    return [
        ("Vault issues a lease (CREATE ROLE + GRANT)", _ms(issue)),
        ("Vault revokes a lease (terminate + DROP ROLE)", _ms(revoke)),
        ("a run's first session right after run creation (the prewarm's issuance in flight)", _ms(first)),
        ("a run's first session once its lease is prewarmed (issued at run creation)", _ms(warmed)),
        ("the run's second session: connect + SELECT (lease held)", _ms(second)),
        ("a SELECT on an open session", _ms(query)),
        ("baseline: connect + SELECT straight to PostgreSQL (SCRAM, no gateway)", _ms(direct)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    rows = measure(args.runs)
    print(f"| {args.runs} runs | median ms | p90 ms | max ms |\n|---|---:|---:|---:|")
    for name, figures in rows:
        print(f"| {name} | {figures} |")


if __name__ == "__main__":
    main()
