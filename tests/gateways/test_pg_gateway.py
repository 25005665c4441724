"""The Postgres gateway against a real PostgreSQL, OpenBao's database engine and psycopg."""

from __future__ import annotations

import psycopg
import pytest

from tests.support.pg_stack import PgStack



def test_select_through_the_gateway(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read")
    with psycopg.connect(pg_stack.dsn(bundle)) as conn:
        rows = conn.execute("SELECT id, name FROM items ORDER BY id").fetchall()
    assert rows == [(1, "first"), (2, "second")]
