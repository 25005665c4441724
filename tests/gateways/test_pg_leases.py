"""The Postgres gateway's leases, identity, TLS and process: per-run Vault leases renewed and
revoked, a gateway identity that reaches only its own roles' leases, TLS to clients, expiry of a
run mid-session, and ``valetkey gateway serve`` as a real process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import hvac
import psycopg
import pytest
import redis

from gateways.sources.issued import KEY, _digest
from tests.support.certs import make_ca, make_leaf
from tests.support.pg_stack import PgStack
from tests.support.source_stack import wait_for
from valetkey.dev.services import free_port


def _issued(stack: PgStack) -> float:
    return stack.gateways["appdb"].metrics.registry.get_sample_value(
        "valetkey_gateway_credential_issued_total",
        {"upstream": "appdb", "kind": "database_password", "result": "ok"}) or 0.0


def test_the_lease_is_renewed_and_moves_the_users_expiry(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read")
    with psycopg.connect(pg_stack.dsn(bundle)) as conn:
        conn.execute("SELECT 1")
    gateway = pg_stack.gateways["appdb"]
    held = gateway.leases.held(bundle["run_id"])
    assert held is not None
    before = pg_stack.postgres.sql(f"SELECT extract(epoch FROM rolvaliduntil)::int FROM pg_roles "
                                   f"WHERE rolname = '{held.credential.username}'")
    time.sleep(1.1)
    renewed = pg_stack.loop.run(gateway.leases.source.refresh(held.claims, held.credential))
    after = pg_stack.postgres.sql(f"SELECT extract(epoch FROM rolvaliduntil)::int FROM pg_roles "
                                  f"WHERE rolname = '{held.credential.username}'")
    assert renewed.id == held.credential.id  # the same lease, later
    assert renewed.expires_at > held.credential.expires_at
    assert int(after) > int(before)


def test_one_lease_per_run_shared_by_its_sessions(pg_stack: PgStack) -> None:
    issued = _issued(pg_stack)  # read first: the lease may be issued at run creation (prewarm)
    bundle = pg_stack.mint("appdb", "read")
    users = set()
    for _ in range(3):
        with psycopg.connect(pg_stack.dsn(bundle)) as conn:
            row = conn.execute("SELECT current_user").fetchone()
            assert row is not None
            users.add(row[0])
    assert len(users) == 1
    assert _issued(pg_stack) == issued + 1


def test_the_gateway_identity_reaches_only_its_own_leases(pg_stack: PgStack) -> None:
    root = hvac.Client(url=pg_stack.vault.addr, token=pg_stack.vault.root_token)
    mine = hvac.Client(url=pg_stack.vault.addr, token=pg_stack.vault.gateway_token("appdb"))
    other_lease = root.read("database/creds/valetkey-budgeted-ro")["lease_id"]
    own_lease = root.read("database/creds/valetkey-appdb-ro")["lease_id"]
    with pytest.raises(hvac.exceptions.Forbidden):
        mine.read("database/creds/valetkey-budgeted-ro")
    with pytest.raises(hvac.exceptions.Forbidden):
        mine.adapter.put(f"/v1/sys/leases/revoke/{other_lease}")
    with pytest.raises(hvac.exceptions.Forbidden):
        mine.adapter.put("/v1/sys/leases/revoke", json={"lease_id": other_lease})
    with pytest.raises(hvac.exceptions.Forbidden):
        mine.read("database/config/appdb")
    mine.adapter.put(f"/v1/sys/leases/revoke/{own_lease}")
    root.sys.revoke_lease(other_lease)


def test_tls_from_the_client(pg_stack: PgStack, tmp_path: Path) -> None:
    ca_file, ca_key, ca = make_ca(tmp_path)
    cert, key = make_leaf(tmp_path, ca_key, ca, "localhost")
    port = free_port()
    gateway = pg_stack.start_gateway("appdb", register=False, VALETKEY_LISTEN=f"127.0.0.1:{port}",
                                     VALETKEY_PG_TLS_CERT_FILE=str(cert), VALETKEY_PG_TLS_KEY_FILE=str(key))
    try:
        bundle = pg_stack.mint("appdb", "read")
        dsn = pg_stack.dsn(bundle, host="localhost", port=str(port), sslmode="verify-full",
                           sslrootcert=str(ca_file))
        with psycopg.connect(dsn) as conn:
            assert conn.info.pgconn.ssl_in_use
            assert conn.execute("SELECT count(*) FROM items WHERE id < 10").fetchone() == (2,)
    finally:
        pg_stack.loop.run(gateway.stop())


def test_a_session_ends_when_its_run_expires(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read", ttl="3s")
    conn = psycopg.connect(pg_stack.dsn(bundle), autocommit=True)
    conn.execute("SELECT 1")
    deadline = time.monotonic() + 10
    error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            error = exc
            break
        time.sleep(0.05)
    conn.close()
    assert error is not None
    assert "valetkey: run_expired:" in str(error)


def test_gateway_serve_runs_the_postgres_gateway(pg_stack: PgStack) -> None:
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "VALETKEY_", "PG"))},
           **pg_stack.gateway_env("appdb", VALETKEY_LISTEN=f"127.0.0.1:{port}")}
    proc = subprocess.Popen([sys.executable, "-m", "valetkey.cli", "gateway", "serve", "--upstream", "appdb"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "the gateway did not listen"
                time.sleep(0.1)
        bundle = pg_stack.mint("appdb", "read")
        with psycopg.connect(pg_stack.dsn(bundle, port=str(port))) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        proc.terminate()
        output = proc.communicate(timeout=15)[0].decode()
    assert bundle["env"]["PGPASSWORD"] not in output
    assert '"event":"credential_issued"' in output


def test_tls_to_the_database_when_the_policy_says(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("tlsdb", "read")  # postgres: {host: localhost, tls: verify-full}
    with psycopg.connect(pg_stack.dsn(bundle, "tlsdb")) as conn:
        row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row == (True,)
    plain = pg_stack.mint("appdb", "read")  # tls: disable
    with psycopg.connect(pg_stack.dsn(plain)) as conn:
        row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row == (False,)


def test_a_stopping_gateway_revokes_what_it_holds(pg_stack: PgStack) -> None:
    port = free_port()
    gateway = pg_stack.start_gateway("appdb", register=False, VALETKEY_LISTEN=f"127.0.0.1:{port}")
    bundle = pg_stack.mint("appdb", "read")
    with psycopg.connect(pg_stack.dsn(bundle, port=str(port))) as conn:
        conn.execute("SELECT 1")
    held = gateway.leases.held(bundle["run_id"])
    assert held is not None
    assert held.credential.username in pg_stack.database_users()
    pg_stack.loop.run(gateway.stop())
    assert held.credential.username not in pg_stack.database_users()


def _published(stack: PgStack, password: str) -> bool:
    client = redis.Redis.from_url(stack.redis_url)
    try:
        return client.zscore(KEY, _digest(password.encode())) is not None
    finally:
        client.close()


def test_the_lease_is_issued_at_run_creation_and_its_password_published(pg_stack: PgStack) -> None:
    """Prewarm: the run's lease exists before its first session, which then costs no Vault call;
    its password's digest is published (HTTP gateways refuse it as passthrough) until run end."""
    gateway = pg_stack.gateways["appdb"]
    issued = _issued(pg_stack)
    bundle = pg_stack.mint("appdb", "read")
    wait_for(lambda: gateway.leases.held(bundle["run_id"]) is not None)
    held = gateway.leases.held(bundle["run_id"])
    assert held is not None
    assert _issued(pg_stack) == issued + 1
    with psycopg.connect(pg_stack.dsn(bundle)) as conn:
        row = conn.execute("SELECT current_user").fetchone()
    assert row == (held.credential.username,)
    assert _issued(pg_stack) == issued + 1  # the session used the prewarmed lease
    password = held.credential.value.reveal()
    assert _published(pg_stack, password)
    pg_stack.end(bundle["run_id"])
    wait_for(lambda: not _published(pg_stack, password))
    assert held.credential.username not in pg_stack.database_users()


def test_each_replica_holds_its_own_lease_and_run_end_revokes_all(pg_stack: PgStack) -> None:
    """Two replicas of one upstream: a lease each for the run (a lease's password lives only in
    Vault and the process that holds it, never in Redis); run end revokes both."""
    port = free_port()
    other = pg_stack.start_gateway("appdb", register=False, VALETKEY_LISTEN=f"127.0.0.1:{port}")
    try:
        bundle = pg_stack.mint("appdb", "read")
        users = set()
        for dsn in (pg_stack.dsn(bundle), pg_stack.dsn(bundle, port=str(port))):
            with psycopg.connect(dsn) as conn:
                row = conn.execute("SELECT current_user").fetchone()
                assert row is not None
                users.add(row[0])
        assert len(users) == 2
        assert users <= set(pg_stack.database_users())
        pg_stack.end(bundle["run_id"])
        wait_for(lambda: not users & set(pg_stack.database_users()))
    finally:
        pg_stack.loop.run(other.stop())
