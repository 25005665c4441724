"""Setting up Vault's database secrets engine for a Postgres upstream (tests, ``valetkey dev`` and
docs/operations.md, which gives the same steps as ``bao`` commands).

Two sides:

* In PostgreSQL (``database_sql``): one group role per purpose (``valetkey_ro`` may read,
  ``valetkey_rw`` may also insert, update and delete; neither may create objects), and a
  management user for Vault with ``CREATEROLE`` (to create and drop the per-run users), the group
  roles ``WITH ADMIN OPTION`` (to grant them), and ``pg_signal_backend`` (to end a revoked user's
  sessions). It is not a superuser.
* In Vault (``configure_engine``): a connection with that management user, and one role per
  purpose whose creation statements create a login user granted that purpose's group role
  (``GRANT valetkey_ro TO "{{name}}"``) and whose revocation statements end the user's sessions
  and drop it. The database enforces the purpose; the gateway never parses SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from valetkey.bootstrap import vault_errors

PLUGIN = "postgresql-database-plugin"
# what each group role may do on every table (now and later) of the database's public schema
GROUP_PRIVILEGES = {"valetkey_ro": "SELECT", "valetkey_rw": "SELECT, INSERT, UPDATE, DELETE"}
CREATION = ('CREATE ROLE "{{name}}" WITH LOGIN PASSWORD \'{{password}}\' '
            "VALID UNTIL '{{expiration}}' INHERIT NOCREATEDB NOCREATEROLE; "
            'GRANT %s TO "{{name}}";')
REVOCATION = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{{name}}'; "
              'DROP ROLE IF EXISTS "{{name}}";')


@dataclass(frozen=True)
class DatabaseRole:
    """A Vault role: its name, the group role it grants, its lease TTLs (seconds)."""

    name: str
    group: str
    default_ttl: int = 300
    max_ttl: int = 86_400


def database_sql(database: str, manager: str, manager_password: str) -> list[str]:
    """Statements a superuser runs once: the group roles, their grants, the management user."""
    out = []
    for group in GROUP_PRIVILEGES:
        out += [
            f"DO $$BEGIN CREATE ROLE {group} NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END$$",
            f'GRANT CONNECT ON DATABASE "{database}" TO {group}',
        ]
    out += [
        f"DO $$BEGIN CREATE ROLE {manager} LOGIN CREATEROLE; "
        "EXCEPTION WHEN duplicate_object THEN NULL; END$$",
        f"ALTER ROLE {manager} WITH LOGIN CREATEROLE PASSWORD '{manager_password}'",
        f"GRANT pg_signal_backend TO {manager}",
        *(f"GRANT {group} TO {manager} WITH ADMIN OPTION" for group in GROUP_PRIVILEGES),
    ]
    return out


def schema_sql(owner: str) -> list[str]:
    """Statements run in the database itself: what each group role may do in schema public."""
    out = []
    for group, privileges in GROUP_PRIVILEGES.items():
        out += [
            f"GRANT USAGE ON SCHEMA public TO {group}",
            f"GRANT {privileges} ON ALL TABLES IN SCHEMA public TO {group}",
            f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public "
            f"GRANT {privileges} ON TABLES TO {group}",
        ]
    out.append("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO valetkey_rw")
    return out


def configure_engine(client: Any, *, mount: str, connection: str, host: str, port: int, database: str,
                     manager: str, manager_password: str, roles: Mapping[str, DatabaseRole],
                     sslmode: str = "verify-full") -> None:
    """Mount the engine (if absent), write the connection and one Vault role per entry of
    ``roles`` (purpose -> role). Idempotent: running it again rewrites the same configuration."""
    with vault_errors(str(client.url), f"configure the database secrets engine at {mount}"):
        if f"{mount}/" not in client.sys.list_mounted_secrets_engines()["data"]:
            client.sys.enable_secrets_engine("database", path=mount)
        client.write_data(f"{mount}/config/{connection}", data=dict(
            plugin_name=PLUGIN,
            connection_url=(f"postgresql://{{{{username}}}}:{{{{password}}}}@{host}:{port}/{database}"
                            f"?sslmode={sslmode}"),
            username=manager, password=manager_password,
            allowed_roles=",".join(sorted(role.name for role in roles.values())),
            verify_connection=True,
        ))
        for role in roles.values():
            client.write_data(f"{mount}/roles/{role.name}", data=dict(
                db_name=connection, creation_statements=[CREATION % role.group],
                revocation_statements=[REVOCATION], default_ttl=role.default_ttl, max_ttl=role.max_ttl,
            ))
