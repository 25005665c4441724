"""`valetkey dev`: the README's first command brings the stack up, mints a demo run, stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.devstack import output_until_ready
from valetkey.dev.services import free_port

pytestmark = pytest.mark.slow

VALETKEY = str(Path(sys.executable).parent / "valetkey")


def _dev(tmp_path: Path, *ports: int, extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    vault, redis, broker = ports
    env = {**os.environ, "VALETKEY_DEV_DIR": str(tmp_path)}
    return subprocess.Popen(
        [VALETKEY, "dev", "--vault-port", str(vault), "--redis-port", str(redis),
         "--broker-port", str(broker), "--gateway-port", "0", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_dev_stack_up_demo_and_clean_stop(tmp_path: Path) -> None:
    ports = (free_port(), free_port(), free_port())
    proc = _dev(tmp_path, *ports)
    text = output_until_ready(proc, 60)
    try:
        assert "Ctrl-C to stop" in text, text
        assert "demo run run_" in text
        assert "OPENAI_API_KEY=" in text
        assert "Try it, in another shell:" in text
        assert "GITHUB_TOKEN=" in text
        proxy = next(line.split()[1] for line in text.splitlines() if line.strip().startswith("proxy "))
        assert httpx.get(f"{proxy}/.valetkey/readyz", timeout=5).json()["status"] == "ready"
        commands = [line.strip().split("   #")[0].strip() for line in text.splitlines()
                     if line.strip().startswith(("set -a", "curl "))]
        assert len(commands) == 5, text
        source, inject, echo, passthrough, held = commands
        outputs = [subprocess.run(["bash", "-c", f"{source}; {cmd}"], capture_output=True, text=True,
                                  timeout=30, check=False).stdout for cmd in (inject, echo, passthrough)]
        assert '"full_name": "acme/widgets"' in outputs[0]
        assert "[REDACTED:valetkey]" in outputs[1]
        assert '"error": "credential_passthrough"' in outputs[2]
        # the console's address and a one-time sign-in link; the held release waits for a person
        console = next(line.split()[-1] for line in text.splitlines() if "sign in once" in line)
        assert console.startswith(f"http://127.0.0.1:{ports[2]}/console/login?code=")
        waiting = subprocess.Popen(["bash", "-c", f"{source}; {held}"], stdout=subprocess.PIPE, text=True)
        admin = {**os.environ, "VALETKEY_DEV_DIR": str(tmp_path),
                 "VAULT_TOKEN": (tmp_path / "admin-token").read_text().strip()}
        listed = ""
        for _ in range(100):
            listed = subprocess.run([VALETKEY, "approvals", "list"], env=admin, capture_output=True,
                                    text=True, timeout=30, check=False).stdout
            if "apr_" in listed:
                break
        approval = listed.split()[0]
        approved = subprocess.run([VALETKEY, "approvals", "approve", approval, "--yes"], env=admin,
                                  capture_output=True, text=True, timeout=30, check=False)
        assert approved.returncode == 0, approved.stderr
        assert '"tag_name": "v1.0"' in waiting.communicate(timeout=30)[0]
        ready = httpx.get(f"http://127.0.0.1:{ports[2]}/readyz", timeout=5)
        assert ready.json()["checks"] == {"vault": True, "vault_token": True, "redis": True, "proxy_ca": True}
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "stopping" in out
    for port in ports:  # every child is gone: nothing listens any more
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_dev_refuses_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        proc = _dev(tmp_path, free_port(), free_port(), taken, extra=("--no-demo",))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"broker port {taken}" in out


def test_dev_with_postgres_serves_the_demo_database(tmp_path: Path) -> None:
    import psycopg

    ports = (free_port(), free_port(), free_port())
    proc = _dev(tmp_path, *ports, extra=("--postgres", "--upstreams", "appdb", "--no-demo"))
    text = output_until_ready(proc, 90)
    try:
        assert "Ctrl-C to stop" in text, text
        assert "PLACEHOLDER" not in text  # the database credential is a lease, not a KV secret
        env = {**os.environ, "VALETKEY_DEV_DIR": str(tmp_path),
               "VAULT_TOKEN": (tmp_path / "runtime-db-agent-token").read_text().strip()}
        created = subprocess.run([VALETKEY, "run", "create", "--grant", "appdb:read", "--format", "json"],
                                 env=env, capture_output=True, text=True, timeout=30, check=True)
        bundle = json.loads(created.stdout)["env"]
        with psycopg.connect(bundle["DATABASE_URL"], password=bundle["PGPASSWORD"]) as conn:
            assert conn.execute("SELECT count(*) FROM items").fetchone() == (2,)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


@pytest.mark.parametrize(("redis", "scheme"), [
    pytest.param("sentinel", "redis+sentinel://", id="sentinel"),
    pytest.param("cluster", "redis+cluster://", id="cluster"),
])
def test_dev_ha_stack(tmp_path: Path, redis: str, scheme: str) -> None:
    """`valetkey dev --ha`: the demo works over a Raft cluster and Redis through Sentinel or a
    Redis Cluster."""
    ports = (free_port(), free_port(), free_port())
    proc = _dev(tmp_path, *ports, extra=("--ha", "--ha-redis", redis))
    text = output_until_ready(proc, 150)
    try:
        assert "Ctrl-C to stop" in text, text
        assert "OpenBao Raft cluster" in text
        assert scheme in text
        commands = [line.strip().split("   #")[0].strip() for line in text.splitlines()
                     if line.strip().startswith(("set -a", "curl "))]
        source, inject = commands[0], commands[1]
        done = subprocess.run(["bash", "-c", f"{source}; {inject}"], capture_output=True, text=True,
                              timeout=30, check=False)
        assert '"full_name": "acme/widgets"' in done.stdout
        ready = httpx.get(f"http://127.0.0.1:{ports[2]}/readyz", timeout=5)
        assert ready.json()["checks"] == {"vault": True, "vault_token": True, "redis": True, "proxy_ca": True}
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
