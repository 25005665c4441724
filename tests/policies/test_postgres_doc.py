"""``protocol: postgres`` upstreams: each broken document fails on exactly its own problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.load import PolicyLoadError, load_policy_dir
from policies.sources import VaultDatabaseSource

VALID = """version: 1
kind: upstream
name: appdb
protocol: postgres
postgres: {host: db.internal, port: 5433, database: app, tls: verify-full}
source: {kind: vault_database, mount: database, roles: {read: appdb-ro, write: appdb-rw}}
env: {placeholder: PGPASSWORD, base_url: DATABASE_URL}
run_limits: {requests: 1000, concurrent: 4}
purposes:
  read: {why: Read the tables., limits: {rate: "60 per 1m"}}
  write: {why: Change rows.}
"""


def _load(tmp_path: Path, text: str) -> None:
    (tmp_path / "appdb.yaml").write_text(text)
    load_policy_dir(tmp_path)


def test_a_postgres_upstream_loads(tmp_path: Path) -> None:
    (tmp_path / "appdb.yaml").write_text(VALID)
    upstream = load_policy_dir(tmp_path).upstreams["appdb"]
    assert upstream.protocol == "postgres"
    assert upstream.postgres is not None
    assert (upstream.postgres.host, upstream.postgres.port, upstream.postgres.database,
            upstream.postgres.tls) == ("db.internal", 5433, "app", "verify-full")
    assert isinstance(upstream.credential_source, VaultDatabaseSource)
    assert dict(upstream.credential_source.roles) == {"read": "appdb-ro", "write": "appdb-rw"}
    assert upstream.secret is None
    assert upstream.run_limits.requests == 1000
    read = upstream.purposes["read"].limits.rate
    assert read is not None
    assert (read.count, read.period) == (60, 60)


@pytest.mark.parametrize(("old", "new", "problem"), [
    pytest.param("protocol: postgres", "protocol: mysql", "'mysql' is not a protocol", id="unknown-protocol"),
    pytest.param("tls: verify-full", "tls: prefer", "'prefer' is not one of", id="tls-prefer"),
    pytest.param("port: 5433", "port: 70000", "70000 is not a port", id="bad-port"),
    pytest.param("database: app", "database: 'a b'", "does not match", id="bad-database"),
    pytest.param("host: db.internal", "host: 'db.internal:5432'", "postgres host", id="host-with-port"),
    pytest.param("kind: vault_database, mount: database, roles: {read: appdb-ro, write: appdb-rw}",
                 "kind: kv", "needs kind vault_database", id="kv-source"),
    pytest.param("env: {placeholder: PGPASSWORD", "env: {placeholder: PGUSER", "PGUSER is a variable",
                 id="placeholder-pguser"),
    pytest.param("write: {why: Change rows.}", "write: {why: Change rows., methods: [GET]}",
                 "unknown key 'methods'", id="http-keys-in-a-purpose"),
    pytest.param("run_limits:", "base_url: http://x\nrun_limits:", "unknown key 'base_url'", id="base-url"),
])
def test_broken_postgres_upstreams(tmp_path: Path, old: str, new: str, problem: str) -> None:
    assert old in VALID
    with pytest.raises(PolicyLoadError) as caught:
        _load(tmp_path, VALID.replace(old, new, 1))
    assert problem in str(caught.value)
