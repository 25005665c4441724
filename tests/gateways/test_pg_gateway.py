"""The Postgres gateway against a real PostgreSQL, OpenBao's database engine and psycopg/psql.

Purposes are enforced by PostgreSQL (the per-run user's group role), so a write on a read grant
must come back as PostgreSQL's own ``permission denied`` (42501), not as a refusal of ours.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import threading
import time
from typing import Any

import psycopg
import pytest
import redis

from gateways import pg_wire as wire
from tests.support.pg_stack import PgStack


def _users_soon(stack: PgStack, present: str, gone: bool, within: float = 5.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if (present not in stack.database_users()) == gone:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"database user {'still there' if gone else 'never created'} after {within}s")


def _lease_user(stack: PgStack, run_id: str, upstream: str = "appdb") -> str:
    held = stack.gateways[upstream].leases.held(run_id)
    assert held is not None
    return held.credential.username


def test_select_through_the_gateway(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read")
    with psycopg.connect(pg_stack.dsn(bundle)) as conn:
        rows = conn.execute("SELECT id, name FROM items ORDER BY id").fetchall()
        # the session runs as the run's own database user, a member of valetkey_ro only
        user = conn.execute("SELECT current_user").fetchone()
    assert rows == [(1, "first"), (2, "second")]
    assert user is not None
    assert user[0] == _lease_user(pg_stack, bundle["run_id"])
    assert user[0].startswith("v-")


def test_write_on_a_read_grant_is_refused_by_postgresql(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read")
    with psycopg.connect(pg_stack.dsn(bundle)) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            conn.execute("INSERT INTO items VALUES (10, 'x')")
        assert caught.value.sqlstate == "42501"  # PostgreSQL's, not a valetkey refusal
        assert "valetkey" not in str(caught.value)
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SET ROLE valetkey_rw")  # not a member: the database says no


def test_write_grant_may_write(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "write")
    with psycopg.connect(pg_stack.dsn(bundle)) as conn:
        conn.execute("INSERT INTO items VALUES (%s, %s) ON CONFLICT (id) DO NOTHING", (20, "written"))
        conn.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE mine (x int)")  # no DDL for either purpose


def test_psql_through_the_gateway(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGPASSWORD"] = bundle["env"]["PGPASSWORD"]
    psql = pg_stack.postgres.bin_dir / "psql"
    done = subprocess.run([str(psql), bundle["env"]["DATABASE_URL"], "-X", "-t", "-A", "-c",
                           "SELECT count(*) FROM items WHERE id < 10"],
                          capture_output=True, env=env, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "2"


def test_run_end_drops_the_database_user_and_cuts_the_session(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read")
    conn = psycopg.connect(pg_stack.dsn(bundle), autocommit=True)
    conn.execute("SELECT 1")
    user = _lease_user(pg_stack, bundle["run_id"])
    assert user in pg_stack.database_users()
    pg_stack.end(bundle["run_id"])  # what `valetkey run end` calls
    took = _users_soon(pg_stack, user, gone=True)
    assert took < 5.0
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    conn.close()
    assert pg_stack.gateways["appdb"].leases.held(bundle["run_id"]) is None


def test_revocation_mid_session_ends_it_within_the_stream_bound(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read")
    conn = psycopg.connect(pg_stack.dsn(bundle), autocommit=True)
    conn.execute("SELECT 1")
    started = time.monotonic()
    pg_stack.revoke(bundle["run_id"])
    error: Exception | None = None
    while time.monotonic() - started < 3.0:  # the HTTP streams' bound (revocation_max_stale)
        try:
            conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            error = exc
            break
        time.sleep(0.02)
    assert error is not None, "the session outlived its run's revocation"
    assert "token_revoked" in str(error) or "terminating connection" in str(error)
    conn.close()


def _login(port: int, params: dict[str, str], password: str | None) -> dict[str, str]:
    """A start-up by hand: the ErrorResponse fields the gateway answers with (C = SQLSTATE)."""

    async def talk() -> dict[str, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(wire.startup_packet(params))
        try:
            while True:
                kind, body = await wire.read_message(reader)
                if kind == b"R" and wire.auth_code(body) == wire.AUTH_CLEARTEXT and password is not None:
                    writer.write(wire.message(b"p", password.encode() + b"\0"))
                elif kind == b"E":
                    return wire.error_fields(body)
                elif kind == b"Z":
                    return {}
        finally:
            writer.close()

    return asyncio.run(asyncio.wait_for(talk(), 10))


@pytest.mark.parametrize(("case", "sqlstate", "reason"), [
    pytest.param("garbage_token", "28P01", "invalid_token", id="garbage-token"),
    pytest.param("empty_token", "28P01", "missing_token", id="empty-token"),
    pytest.param("other_audience", "28P01", "audience_mismatch", id="token-of-another-upstream"),
    pytest.param("user_mismatch", "28000", "run_mismatch", id="user-is-not-the-run"),
    pytest.param("other_database", "3D000", "database_not_granted", id="another-database"),
    pytest.param("two_purposes", "28000", "purpose_ambiguous", id="two-purposes"),
    pytest.param("revoked", "28P01", "token_revoked", id="revoked-run"),
    pytest.param("ended", "28P01", "token_revoked", id="ended-run"),
    pytest.param("replication", "08P01", "protocol_violation", id="replication"),
])
def test_refusals_name_their_reason(pg_stack: PgStack, case: str, sqlstate: str, reason: str) -> None:
    bundle = pg_stack.mint("appdb", "read")
    run, token = bundle["run_id"], bundle["env"]["PGPASSWORD"]
    params = {"user": run, "database": "app"}
    if case == "garbage_token":
        token = "eyJhbGciOiJFZERTQSJ9.e30.AAAA"
    elif case == "empty_token":
        token = ""
    elif case == "other_audience":
        token = pg_stack.mint("budgeted", "read")["env"]["BUDGETED_PGPASSWORD"]
    elif case == "user_mismatch":
        params["user"] = "run_somebodyelse"
    elif case == "other_database":
        params["database"] = "postgres"
    elif case == "two_purposes":
        both = pg_stack.mint_grants([{"upstream": "appdb", "purpose": "read"},
                                     {"upstream": "appdb", "purpose": "write"}])
        params["user"], token = both["run_id"], both["env"]["PGPASSWORD"]
    elif case == "revoked":
        pg_stack.revoke(run)
    elif case == "ended":
        pg_stack.end(run)
    elif case == "replication":
        params["replication"] = "database"
    deadline = time.monotonic() + 3.0  # a revocation reaches the gateway over pub/sub
    fields = _login(pg_stack.gateways["appdb"].port, params, token)
    while not fields and time.monotonic() < deadline:
        time.sleep(0.05)
        fields = _login(pg_stack.gateways["appdb"].port, params, token)
    assert fields.get("C") == sqlstate, fields
    assert fields["M"].startswith(f"valetkey: {reason}:"), fields
    assert fields["S"] == "FATAL"
    assert token not in fields["M"] or not token


def test_psycopg_sees_the_reason(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read")
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(pg_stack.dsn(bundle, user="run_nope")).close()
    assert "valetkey: run_mismatch:" in str(caught.value)
    assert bundle["env"]["PGPASSWORD"] not in str(caught.value)


def test_budget_counts_queries(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("budgeted", "read")  # run_limits: {requests: 3}
    with psycopg.connect(pg_stack.dsn(bundle, "budgeted"), autocommit=True) as conn:
        for _ in range(3):
            conn.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError) as caught:
            conn.execute("SELECT 1")
    assert "valetkey: budget_exceeded:" in str(caught.value)


def _audit(stack: PgStack, run_id: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(stack.redis_url)
    try:
        for _ in range(60):
            lines = [json.loads(fields[b"line"]) for _, fields in client.xrange("valetkey:audit")]
            mine = [line for line in lines if line.get("run") == run_id and "method" in line]
            if any(line.get("method") == "SESSION_END" for line in mine):
                return mine
            time.sleep(0.05)
    finally:
        client.close()
    raise AssertionError("no SESSION_END audit line")


def test_audit_per_session_and_query_without_secrets(pg_stack: PgStack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="valetkey.gateway")
    bundle = pg_stack.mint("appdb", "read")
    token = bundle["env"]["PGPASSWORD"]
    with psycopg.connect(pg_stack.dsn(bundle), autocommit=True) as conn:
        conn.execute("SELECT name FROM items WHERE id = %s", (1,))
        conn.execute("/* a comment */ select 'secret-looking-literal-42'")
        held = pg_stack.gateways["appdb"].leases.held(bundle["run_id"])
        assert held is not None
        password = held.credential.value.reveal()
    lines = _audit(pg_stack, bundle["run_id"])
    queries = [line for line in lines if line.get("method") == "QUERY"]
    assert [q["path"] for q in queries] == ["SELECT", "SELECT"]
    assert queries[0]["bytes_in"] == len("SELECT name FROM items WHERE id = $1")
    assert {line.get("method") for line in lines} == {"SESSION", "QUERY", "SESSION_END"}
    end = next(line for line in lines if line.get("method") == "SESSION_END")
    assert (end["status"], end["reason"], end["purpose"]) == (2, "ok", "read")
    everything = json.dumps(lines) + caplog.text
    for secret in (token, password, "secret-looking-literal-42", "first"):
        assert secret not in everything
    assert held.credential.id in caplog.text  # the lease id names the credential in the log
    assert {(line["credential_kind"], line["credential_id"]) for line in lines
            if line["method"] != "SESSION" or line["decision"] == "allow"} == {
        ("database_password", held.credential.id)}
    metrics = pg_stack.gateways["appdb"].metrics.registry
    assert (metrics.get_sample_value("valetkey_gateway_credential_issued_total", {
        "upstream": "appdb", "kind": "database_password", "result": "ok"}) or 0) >= 1


def test_a_cancel_request_reaches_the_database(pg_stack: PgStack) -> None:
    bundle = pg_stack.mint("appdb", "read")
    with psycopg.connect(pg_stack.dsn(bundle)) as conn:
        pid = conn.info.backend_pid  # the gateway's own key, not the database backend's
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        assert row[0] != pid
        timer = threading.Timer(0.3, conn.cancel_safe)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(10)")
        timer.join()
        assert time.monotonic() - started < 5
