"""A demo database behind a Postgres gateway, for the tests, the benchmark and ``valetkey dev``:
database ``app`` with a table ``items`` in a fresh ``PostgresServer``, the group roles and
Vault's management user (``valetkey.database_engine``), and the engine configured in a dev Vault
with one read-only and one read-write role per upstream."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from valetkey.database_engine import DatabaseRole, configure_engine, database_sql, schema_sql
from valetkey.dev.postgres import PostgresServer

DATABASE = "app"
MANAGER = "valetkey_vault"
MOUNT = "database"
PURPOSE_GROUPS = (("read", "ro"), ("write", "rw"))


def upstream_policy(name: str, port: int, placeholder: str = "PGPASSWORD", url: str = "DATABASE_URL",
                    requests: int | None = None, host: str = "127.0.0.1", tls: str = "disable") -> str:
    """A ``protocol: postgres`` upstream for the demo database at ``127.0.0.1:port``."""
    limits = f"run_limits: {{requests: {requests}}}\n" if requests else ""
    return f"""version: 1
kind: upstream
name: {name}
protocol: postgres
allow_private: true
{limits}postgres: {{host: {host}, port: {port}, database: {DATABASE}, tls: {tls}}}
source:
  kind: vault_database
  mount: {MOUNT}
  roles: {{read: {role(name, 'ro')}, write: {role(name, 'rw')}}}
env: {{placeholder: {placeholder}, base_url: {url}}}
purposes:
  read: {{why: Read the application's tables.}}
  write: {{why: Change rows in the application's tables.}}
"""


def role(upstream: str, group: str) -> str:
    return f"valetkey-{upstream}-{group}"


def prepare(postgres: PostgresServer) -> str:
    """Create the demo database, its roles and Vault's management user; returns that user's
    password (random; give it to ``configure``)."""
    password = secrets.token_urlsafe(24)
    postgres.sql(f"CREATE DATABASE {DATABASE}")
    for statement in database_sql(DATABASE, MANAGER, password):
        postgres.sql(statement)
    postgres.sql("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL); "
                 "INSERT INTO items VALUES (1, 'first'), (2, 'second')", database=DATABASE)
    for statement in schema_sql(postgres.superuser):
        postgres.sql(statement, database=DATABASE)
    return password


def configure(client: Any, postgres: PostgresServer, upstreams: list[str], manager_password: str,
              ttl: int = 300) -> None:
    """One connection and two roles (read, write) per upstream, in the engine at ``MOUNT``."""
    for name in upstreams:
        configure_engine(client, mount=MOUNT, connection=name, host="127.0.0.1", port=postgres.port,
                         database=DATABASE, manager=MANAGER, manager_password=manager_password,
                         roles={purpose: DatabaseRole(role(name, group), f"valetkey_{group}", ttl)
                                for purpose, group in PURPOSE_GROUPS},
                         sslmode="disable")


DEV_UPSTREAM = "appdb"
DEV_RUNTIME = """version: 1
kind: runtime
name: db-agent
identity: {vault_policy: valetkey-runtime-db-agent}
max_ttl: 1h
allow:
  appdb: [read, write]
"""


def write_dev_policies(directory: Path, postgres_port: int) -> None:
    """``valetkey dev --postgres``: upstream ``appdb`` (the demo database) and runtime ``db-agent``."""
    (directory / f"{DEV_UPSTREAM}.yaml").write_text(upstream_policy(DEV_UPSTREAM, postgres_port))
    (directory / "db-agent.yaml").write_text(DEV_RUNTIME)
